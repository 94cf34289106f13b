"""Studies: pools x protocols x datasets over one call cache, in process or on a Ray cluster.

    >>> from colab_graphs.study import load_study_config, play_study   # doctest: +SKIP
    >>> config = load_study_config("study.yaml")
    >>> report = asyncio.run(play_study(config, "studies/s1", client=ModelClient(CallCache())))

`colab-graphs study --config study.yaml --out DIR [--ray ADDRESS]` is the same from the command line.
"""

from colab_graphs.study.config import StudyConfig, StudyConfigError, load_study_config
from colab_graphs.study.report import CorrelationRow, SettingResult, StudyReport, read_study
from colab_graphs.study.run import StudyError, play_study

__all__ = [
    "CorrelationRow",
    "SettingResult",
    "StudyConfig",
    "StudyConfigError",
    "StudyError",
    "StudyReport",
    "load_study_config",
    "read_study",
    "play_study",
]
