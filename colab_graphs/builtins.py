"""The package's own plugin: importing this module registers every built-in protocol, aggregator, router and
scorer in the one registry (`colab_graphs.registry`). It is the entry point ``builtins`` of the group
``colab_graphs.plugins`` (pyproject.toml), loaded like any third-party plugin, so the core never imports the
protocol library.
"""

from __future__ import annotations

from colab_graphs import aggregators  # noqa: F401  (vote, first, last, concat, extract; match_name, confidence)
from colab_graphs.protocols import (  # noqa: F401
    api,
    api_decoding,
    api_mentor,
    api_trained,
    basic,
    logit,
    text,
    text_agglm,
    text_finetune,
    text_select,
    text_sparta,
    text_structured,
    text_swarms,
    weight,
)
from colab_graphs.tasks.scoring import register_task
from colab_graphs.tasks.task_types import BUILTIN_TASKS

for _task in BUILTIN_TASKS:
    register_task(_task)
