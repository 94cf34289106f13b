"""One typed, versioned log for everything `run`, `audit`, `study` and `train` write (docs/log.md).

>>> from colab_graphs.log import read_log
>>> log = read_log("audits/vote")                      # doctest: +SKIP
>>> play = log.play("q1", ["a", "b"])                  # doctest: +SKIP
>>> [(t.seat, t.completion) for t in log.turns(play)]  # doctest: +SKIP
"""

from colab_graphs.log.model import Log, Turn
from colab_graphs.log.reader import RecordStream, find_kind, read_log, read_records
from colab_graphs.log.records import (
    LOG_FILE,
    LOG_VERSION,
    CallRecord,
    CallRef,
    EvaluationRecord,
    ExampleRecord,
    Header,
    LogError,
    LogVersionError,
    PlanRecord,
    PlayRecord,
    RolloutRecord,
    RolloutTurn,
    StepRecord,
)
from colab_graphs.log.writer import LogWriter, write_log
from colab_graphs.trace import Play

__all__ = [
    "LOG_FILE",
    "LOG_VERSION",
    "CallRecord",
    "CallRef",
    "EvaluationRecord",
    "ExampleRecord",
    "Header",
    "Log",
    "LogError",
    "LogVersionError",
    "LogWriter",
    "Play",
    "PlanRecord",
    "PlayRecord",
    "RolloutRecord",
    "RolloutTurn",
    "StepRecord",
    "Turn",
    "find_kind",
    "read_log",
    "read_records",
    "RecordStream",
    "write_log",
]
