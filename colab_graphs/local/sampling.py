"""How to sample, as OpenAI names it: the settings the in-process provider checks on a pool member and the
server (`colab_graphs.serve.openai_api`) checks on a request body."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, model_validator

MAX_STOP = 16


class SamplingParams(BaseModel):
    """How to sample, as OpenAI names it; the ranges are OpenAI's (temperatures up to 2, 20 top logprobs).

    ``top_p`` must be above 0 (0 would leave no token to draw); seeds are 64-bit.
    """

    model_config = ConfigDict(strict=True, extra="ignore")

    max_tokens: int | None = Field(None, ge=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    temperature: float | None = Field(None, ge=0, le=2, allow_inf_nan=False)
    top_p: float | None = Field(None, gt=0, le=1, allow_inf_nan=False)
    seed: int | None = Field(None, ge=-(2**63), lt=2**64)
    stop: str | list[str] | None = None
    top_logprobs: int | None = Field(None, ge=0, le=20)

    @model_validator(mode="after")
    def _stops(self) -> SamplingParams:
        stops = self.stop_strings
        if len(stops) > MAX_STOP or not all(stops):
            raise ValueError(f"stop takes at most {MAX_STOP} non-empty strings")
        return self

    @property
    def stop_strings(self) -> list[str]:
        return [self.stop] if isinstance(self.stop, str) else list(self.stop or [])

    @property
    def completion_limit(self) -> int | None:
        return self.max_completion_tokens or self.max_tokens
