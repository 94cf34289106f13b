"""Spending caps: `--max-calls N` and `--max-cost USD`, checked before each new upstream call.

A `SpendCap` set on a `ModelClient` (`client.cap`) is asked before every call the client would send upstream;
cached calls and calls shared in flight never reach it, so they are free. A call that would pass a cap is not
sent: the client raises `CapReached`, and from then on refuses every new upstream call, while the calls
already in flight finish (their replies are cached, so a resumed run does not pay for them again).

The cost check counts what finished calls cost plus an upper estimate of each call in flight and of the
next one (its prompt tokens and its `max_tokens`, `colab_graphs.models.pricing`); a member without
`max_tokens` is estimated at `DEFAULT_COMPLETION_TOKENS` per reply, so the cost cap is a hard bound only
where every member sets `max_tokens`.
"""

from __future__ import annotations

from typing import Any

from colab_graphs.models.pricing import estimate_cost
from colab_graphs.pool import Member


class CapReached(Exception):
    """A new upstream call would pass a spending cap; it was not sent.

    Attributes:
        cap: "max_calls" or "max_cost".
        limit: the cap's value.
        spent: calls made, or USD spent (finished calls plus the estimates of those in flight), when it was hit.
    """

    def __init__(self, cap: str, limit: float, spent: float):
        unit = "calls" if cap == "max_calls" else "USD"
        super().__init__(
            f"--{cap.replace('_', '-')} {limit:g} reached ({spent:g} {unit} spent): no new call sent"
        )
        self.cap = cap
        self.limit = limit
        self.spent = spent


class SpendCap:
    """Caps on the upstream calls a client makes and what they cost.

    Args:
        max_calls: most upstream calls (None: no cap).
        max_cost_usd: most USD (None: no cap); every member called must have a known price
            (`colab_graphs.models.pricing.member_price`), checked by the caller before the run.
    """

    def __init__(self, max_calls: int | None = None, max_cost_usd: float | None = None):
        self.max_calls = max_calls
        self.max_cost_usd = max_cost_usd
        self.calls = 0
        self.cost = 0.0
        self.reached: CapReached | None = None

    def reserve(self, member: Member, messages: list[dict[str, Any]], settings: dict[str, Any]) -> float:
        """Count one call about to be sent; returns its cost estimate. Raises `CapReached` instead of counting
        it when it would pass a cap (and for every call after that)."""
        if self.reached is not None:
            raise CapReached(self.reached.cap, self.reached.limit, self.reached.spent)
        if self.max_calls is not None and self.calls + 1 > self.max_calls:
            self.reached = CapReached("max_calls", self.max_calls, self.calls)
            raise self.reached
        estimate = 0.0
        if self.max_cost_usd is not None:
            estimate = estimate_cost(member, messages, settings) or 0.0
            if self.cost + estimate > self.max_cost_usd:
                self.reached = CapReached("max_cost", self.max_cost_usd, round(self.cost, 6))
                raise self.reached
        self.calls += 1
        self.cost += estimate
        return estimate

    def settle(self, estimate: float, actual: float | None) -> None:
        """A reserved call finished: its actual price replaces the estimate (a failed call costs nothing)."""
        self.cost += (actual if actual is not None else estimate) - estimate
