"""Prompt templates shared by the built-in protocols. Override any of them with `-P prompt=...`."""

ANSWER = "{input}\n\n{answer_format}"
"""The question, then how to answer it: `{answer_format}` is the task's own instruction (a number, a
boxed expression, an option letter, one fenced Python function; see `colab_graphs.tasks.task_types`)."""
