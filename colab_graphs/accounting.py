"""Accounting: what a run, an audit or a study called, spent and saved, computed from its plays' call records.

One function, `account`, over the plays (each a `Trace` with its `Call`s), for every producer: a run's
`summary.json` (`calls`, `tokens`, `cost_usd`, `cost_saved_usd`), an audit's `report.json` (the same, plus
`unique`, `naive`, per member and per coalition) and a study's `study.json` (`calls`).

A call is *made* when it went upstream (not served from the cache, an identical call in flight, another
coalition's identical request or a replay). A cached call whose key is in `made_before` (the cache's write
times say this job made it before a kill and resume, and no recorded play made it: `made_since`) counts as
made once. Tokens and `cost_usd` are those of the calls made (0.0 when none was: nothing was spent);
`cost_saved_usd` is what the cached calls cost when they were made (what serving them saved). Either is None
when a price it sums is unknown. Prices are summed exactly (`math.fsum`), so a total does not depend on the
order the plays finished in (which coalition's play made a shared call, under load, is a matter of timing).
"""

from __future__ import annotations

import copy
import math
from collections.abc import Iterable, Sequence, Set
from dataclasses import dataclass, field
from typing import Protocol

from colab_graphs.trace import Call, Trace


class TokenUse(Protocol):
    @property
    def prompt_tokens(self) -> int: ...
    @property
    def completion_tokens(self) -> int: ...


class CallUse(Protocol):
    """What the accounting reads of a call: a `Call`, or a play cache's `ServedCall` (no model copied)."""

    @property
    def key(self) -> str: ...
    @property
    def member(self) -> str: ...
    @property
    def cached(self) -> bool: ...
    @property
    def error(self) -> str | None: ...
    @property
    def cost_usd(self) -> float | None: ...
    @property
    def usage(self) -> TokenUse: ...


class PlayUse(Protocol):
    """What the accounting reads of a play: a `Trace`, or a play cache's `ServedPlay`."""

    @property
    def game(self) -> str: ...
    @property
    def coalition(self) -> list[str]: ...
    @property
    def calls(self) -> Sequence[CallUse]: ...


def add_cost(total: float | None, cost: float | None) -> float | None:
    """A sum of prices that is unknown (None) as soon as one price is."""
    return None if total is None or cost is None else total + cost


def _grow(partials: list[float], x: float) -> None:
    """Add `x` to `partials`, non-overlapping floats whose exact sum is the exact sum of all added (Shewchuk's
    expansion, as `math.fsum` keeps it): a few floats, however many are added."""
    i = 0
    for y in partials:
        if abs(x) < abs(y):
            x, y = y, x
        high = x + y
        low = y - (high - x)
        if low:
            partials[i] = low
            i += 1
        x = high
    partials[i:] = [x]


@dataclass
class Spend:
    """Calls, their tokens and their price: a member's share of an accounting, or a coalition's."""

    calls: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cost_usd: float | None = 0.0
    _partials: list[float] = field(default_factory=list, repr=False, compare=False)

    def add(self, call: CallUse, *, paid: bool = True) -> None:
        """Count `call`, and its price when `paid` (a call served from cache costs nothing)."""
        self.calls += 1
        self.prompt_tokens += call.usage.prompt_tokens
        self.completion_tokens += call.usage.completion_tokens
        if paid:
            self.cost_usd = add_cost(self.cost_usd, call.cost_usd)
            if call.cost_usd is not None:
                _grow(self._partials, call.cost_usd)

    def settle(self) -> None:
        """The price summed exactly: the same total whatever order the calls were added in (`math.fsum` of
        the prices, which the partials sum to exactly)."""
        if self.cost_usd is not None:
            self.cost_usd = math.fsum(self._partials)


@dataclass
class Accounting:
    """The calls of a set of plays: counts, the tokens and price of the calls made, and their shares.

    Attributes:
        made: Calls sent to a model that answered (retries of one request count once); failed calls are not
            among them (a failed call is neither an answer nor a cost: a run whose every call failed made 0).
        unique: Distinct requests, the least any evaluation can make.
        cached: Calls served without a call of their own.
        failed: Calls sent that failed after retries (counted apart from `made`; the calls attempted are
            `made + failed`).
        naive: Every use of a call: what playing each play alone, with no cache, would make.
        prompt_tokens, completion_tokens, cost_usd: Of the calls made.
        cost_saved_usd: What the cached calls cost when they were made.
        per_member: The calls made, by member.
        per_coalition: By (game, coalition): every call its plays needed, made or cached, with the price of
            those made: what evaluating that coalition on its own would take.
    """

    made: int = 0
    unique: int = 0
    cached: int = 0
    failed: int = 0
    naive: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cost_usd: float | None = 0.0
    cost_saved_usd: float | None = 0.0
    per_member: dict[str, Spend] = field(default_factory=dict)
    per_coalition: dict[tuple[str, tuple[str, ...]], Spend] = field(default_factory=dict)

    def calls(self) -> dict[str, int]:
        """`{"made", "unique", "cached", "failed", "naive"}`, as report.json and study.json hold them."""
        return {
            "made": self.made,
            "unique": self.unique,
            "cached": self.cached,
            "failed": self.failed,
            "naive": self.naive,
        }


def account(plays: Iterable[Trace], made_before: Set[str] = frozenset()) -> Accounting:
    """The accounting of `plays` (see the module docstring); `made_before`: keys this job made before a resume.

    Example:
        >>> made = Call(member="a", model="m", messages=[], key="k", usage={"prompt_tokens": 3}, cost_usd=0.5)
        >>> hit = made.model_copy(update={"cached": True})
        >>> acct = account([Trace(example_id="q", protocol="p", calls=[made, hit])])
        >>> (acct.made, acct.cached, acct.unique, acct.prompt_tokens, acct.cost_usd, acct.cost_saved_usd)
        (1, 1, 1, 3, 0.5, 0.5)
    """
    plays = list(plays)
    # A key a recorded play made itself is counted there, never again as made before the resume.
    tally = Tally(set(made_before) - {c.key for p in plays for c in p.calls if not c.cached})
    for play in plays:
        tally.add(play)
    return tally.result()


class Tally:
    """`account` as a running total: plays are added as they finish and not kept (only their calls' keys, for
    `unique`).

    Args:
        resumable: keys made before a resume that no recorded play made (see `account`); a cached use of one
            of them counts as made, once.
    """

    def __init__(self, resumable: Set[str] = frozenset()):
        self.acct = Accounting()
        self.keys: set[str] = set()
        self.made_keys: set[str] = set()  # keys a play sent itself (not cached)
        self.resumable = set(resumable)
        self.spent, self.saved = Spend(), Spend()  # the calls made and the calls served, for their exact sums

    def add(self, play: PlayUse) -> None:
        acct = self.acct
        share = acct.per_coalition.setdefault((play.game, tuple(play.coalition)), Spend())
        for call in play.calls:
            self.keys.add(call.key)
            if not call.cached:
                self.made_keys.add(call.key)
            acct.naive += 1
            if call.error is not None:
                acct.failed += 1
                share.add(call, paid=False)
                continue
            made = not call.cached or call.key in self.resumable
            if call.cached and made:
                self.resumable.discard(call.key)  # made once before the resume: its other uses are cache hits
            share.add(call, paid=made)
            if not made:
                acct.cached += 1
                self.saved.add(call)
                continue
            acct.made += 1
            acct.prompt_tokens += call.usage.prompt_tokens
            acct.completion_tokens += call.usage.completion_tokens
            self.spent.add(call)
            acct.per_member.setdefault(call.member, Spend()).add(call)

    def result(self) -> Accounting:
        """The accounting of the plays added so far (a copy: adding more plays does not change it)."""
        acct = self.acct
        for share in (self.spent, self.saved, *acct.per_member.values(), *acct.per_coalition.values()):
            share.settle()
        acct.cost_usd, acct.cost_saved_usd = self.spent.cost_usd, self.saved.cost_usd
        acct.unique = len(self.keys)
        return copy.deepcopy(acct)


def count_calls(calls: Iterable[Call]) -> tuple[int, int]:
    """(made, cached) of one play's calls as progress counts them: a failed call is neither (see `account`)."""
    calls = list(calls)
    cached = sum(c.cached for c in calls if c.error is None)
    return sum(not c.cached for c in calls if c.error is None), cached


class WriteTimes(Protocol):
    """What `made_since` asks of a call cache (`colab_graphs.models.cache.CallCache`)."""

    def written_since(self, keys: set[str], since: float) -> set[str]: ...


def made_since(cache: WriteTimes | None, plays: Iterable[Trace], since: float) -> set[str]:
    """The keys of `plays`' calls that `cache` stored at or after `since` (when the job first started): calls
    the job made, even where a resumed run found them in the cache."""
    if cache is None:
        return set()
    return cache.written_since({c.key for p in plays for c in p.calls}, since)
