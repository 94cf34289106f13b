"""The unit of every dataset: one example with an id, an input, and an answer or a test."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, model_validator


class DatasetError(ValueError):
    """A dataset could not be read; the message names the source, and the line and field where there is one."""


class Example(BaseModel):
    """One task instance.

    `answer` serves exact-match / numeric / multiple-choice tasks; `test` (Python source that raises on
    failure) serves coding tasks, with `entry_point` naming the function under test. Any other field (choices,
    solution, topic, ...) passes through to prompt templates and scorers via `fields`.
    """

    model_config = ConfigDict(extra="allow", frozen=True)

    id: str
    input: str
    answer: str | None = None
    test: str | None = None
    entry_point: str | None = None

    @model_validator(mode="before")
    @classmethod
    def _coerce(cls, data: Any) -> Any:
        if isinstance(data, dict):
            data = dict(data)
            if "id" in data and not isinstance(data["id"], str):
                data["id"] = str(data["id"])
            if "answer" in data and data["answer"] is not None and not isinstance(data["answer"], str):
                data["answer"] = str(data["answer"])
        return data

    @property
    def fields(self) -> dict[str, Any]:
        """Every field, the pass-through ones included (what prompt templates can use)."""
        return self.model_dump()
