"""Tasks: datasets, the task types that read and score their answers, and scoring.

Contract: what a record is (`example`), where records come from (`loaders`, `benchmarks`, `builtin`), what a
record needs to be scored, checked when it loads (`checks`), and how an answer is shown, extracted, compared
and scored (`task_types`, `answers`, `scoring`, `judge`). Code is scored in the sandbox (`colab_graphs.sandbox`,
called by `task_types` and `scoring`; `answers` reads Python's top-level names with the sandbox's `code_tests`).
It imports the registry, `files` and the sandbox, never the model packages (`models`, `local`, `serve`,
`langchain`) or anything above the core; the sandbox never imports it back."""

from colab_graphs.tasks.example import Example

__all__ = ["Example"]
