"""Tasks: datasets, the task types that read and score their answers, and scoring.

Contract: what a record is (`example`), where records come from (`loaders`, `benchmarks`, `builtin`), what a
record needs to be scored, checked when it loads (`checks`), and how an answer is shown, extracted, compared
and scored (`task_types`, `answers`, `scoring`, `judge`). Code is scored in the sandbox (`colab_graphs.sandbox`),
which this package reaches only through `scoring`. It imports the core's plain modules, never the call path's
internals, the layers above the core, or the protocol library.
"""

from colab_graphs.tasks.example import Example

__all__ = ["Example"]
