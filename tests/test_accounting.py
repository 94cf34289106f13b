"""`colab_graphs.accounting`: one accounting of calls over plays, for runs, audits and studies alike.

The end-to-end numbers (summary.json, report.json, study.json) are checked by the runner, audit and study
tests; these pin the rules the function applies to the records it is given.
"""

from __future__ import annotations

import math

from colab_graphs.accounting import account
from colab_graphs.trace import Call, Play, Usage


def call(key: str, member: str = "a", *, cost: float | None = 0.25, **fields) -> Call:
    return Call(
        member=member,
        model="m",
        messages=[],
        key=key,
        usage=Usage(prompt_tokens=10, completion_tokens=2),
        cost_usd=cost,
        **fields,
    )


def play(game: str, coalition: list[str], *calls: Call) -> Play:
    return Play(example_id="q", protocol="p", game=game, coalition=coalition, calls=list(calls))


def test_a_call_served_again_costs_nothing_and_counts_what_it_saved():
    acct = account(
        [play("coalition", ["a"], call("k")), play("coalition", ["a", "b"], call("k", cached=True))]
    )
    assert (acct.made, acct.cached, acct.unique, acct.naive) == (1, 1, 1, 2)
    assert (acct.prompt_tokens, acct.cost_usd, acct.cost_saved_usd) == (10, 0.25, 0.25)


def test_a_coalition_share_holds_every_call_it_needed_priced_only_where_it_made_them():
    acct = account(
        [play("coalition", ["a"], call("k")), play("coalition", ["a", "b"], call("k", cached=True))]
    )
    alone, pair = acct.per_coalition[("coalition", ("a",))], acct.per_coalition[("coalition", ("a", "b"))]
    assert (alone.calls, alone.prompt_tokens, alone.cost_usd) == (1, 10, 0.25)
    assert (pair.calls, pair.prompt_tokens, pair.cost_usd) == (1, 10, 0.0)


def test_a_member_share_counts_only_the_calls_made():
    acct = account([play("run", ["a", "b"], call("k"), call("k", cached=True), call("j", member="b"))])
    assert {m: s.calls for m, s in acct.per_member.items()} == {"a": 1, "b": 1}


def test_a_failed_call_counts_as_failed_not_made_and_costs_nothing():
    acct = account([play("run", ["a"], call("k", error="boom", cost=None)), play("run", ["a"], call("j"))])
    assert (acct.made, acct.failed, acct.cost_usd) == (
        1,
        1,
        0.25,
    )  # the failed one made nothing, cost nothing
    assert {m: s.calls for m, s in acct.per_member.items()} == {"a": 1}


def test_one_unknown_price_makes_the_total_unknown():
    acct = account([play("run", ["a"], call("k"), call("j", cost=None))])
    assert acct.cost_usd is None and acct.per_member["a"].cost_usd is None


def test_a_call_made_before_a_resume_counts_as_made_once_though_the_resumed_plays_found_it_cached():
    plays = [play("coalition", ["a"], call("k", cached=True)), play("solo", ["a"], call("k", cached=True))]
    acct = account(plays, made_before={"k"})
    assert (acct.made, acct.cached, acct.cost_usd, acct.cost_saved_usd) == (1, 1, 0.25, 0.25)


def test_a_key_a_recorded_play_made_is_not_counted_again_as_made_before_the_resume():
    plays = [play("coalition", ["a"], call("k")), play("solo", ["a"], call("k", cached=True))]
    assert account(plays, made_before={"k"}).made == 1


def test_a_total_is_the_same_whatever_order_the_plays_finished_in():
    # Which coalition's play made a shared call is a matter of timing; float sums in another order differ in
    # the last bit (0.1 + 0.2 + 0.3 != 0.3 + 0.2 + 0.1), so the totals are summed exactly.
    costs = [0.1, 0.2, 0.3, 7.04e-05, 1e-17]
    plays = [
        play("coalition", [m], call(f"k{i}", m, cost=c))
        for i, (m, c) in enumerate(zip("abaab", costs, strict=True))
    ]
    forward, backward = account(plays), account(plays[::-1])
    assert forward.cost_usd == backward.cost_usd == math.fsum(costs)
    assert {m: s.cost_usd for m, s in forward.per_member.items()} == {
        m: s.cost_usd for m, s in backward.per_member.items()
    }
    assert (0.1 + 0.2 + 0.3) != (0.3 + 0.2 + 0.1)  # what the sums above would otherwise depend on
