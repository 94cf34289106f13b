"""An audit's plays are held in its log, not in memory (`colab_graphs.audit.plays`).

What is checked, through `play_audit`: the report is the one the plays held in memory give, value for value
(calls, tokens and prices included); the plays alive while an audit runs are bounded by the examples in flight,
not by the dataset (counted with `gc`, not measured as memory); a play read back from the log is the play that
was recorded; a rerun from a full call cache (in a new folder, or in the same one) sends no request and gives
the same report.
"""

from __future__ import annotations

import gc
import math
import random

import pytest
from realistic_team import MEMBERS, PRICED, priced_team, records

from colab_graphs.accounting import Spend
from colab_graphs.audit.game import CoalitionGame, coalition_id
from colab_graphs.audit.plays import LoggedPlays
from colab_graphs.audit.run import play_audit
from colab_graphs.models.cache import CallCache
from colab_graphs.models.client import ModelClient
from colab_graphs.pool import Pool
from colab_graphs.protocol_registry import build_protocol
from colab_graphs.tasks.builtin import builtin_task
from colab_graphs.testing import arithmetic_solver
from colab_graphs.trace import Call, Trace

# What two runs of one audit may differ in: when and how long.
WHEN = {"created_at", "wall_s", "version"}
# What a rerun from the cache also differs in: the calls' split between made and cached, and what was spent.
SPENT = {"calls", "tokens", "usage", "cost_usd", "cost_saved_usd"}

STYLES = [  # how real models put an answer
    "Let me work it out step by step.\n\n#### {answer}",
    "So the result is $\\boxed{{{answer}}}$.",
    "The answer is {answer}.",
    "I think it is {answer}, but the answer is {answer}.",
]


@pytest.fixture
def priced(scripted_server):
    """The three members under model names LiteLLM prices, on MoCo's ARC-Challenge and GSM8K records."""
    examples = records(limit=4)
    server = scripted_server(priced_team(examples))
    pool = Pool.from_dict(
        {m: {"model": f"openai/{PRICED[m]}", "api_base": server.base_url, "api_key": "sk-t"} for m in MEMBERS}
    )
    return server, pool, examples


def client_for(cache: CallCache, concurrency: int = 4) -> ModelClient:
    return ModelClient(cache, max_concurrency=concurrency, backoff_s=0.01)


def fields(report, leave_out=WHEN) -> dict:
    return {k: v for k, v in report.model_dump(mode="json").items() if k not in leave_out}


@pytest.mark.parametrize(
    ("protocol", "options"),
    [
        ("majority_vote", {"method": "exact"}),
        ("majority_vote", {"method": "exact", "play_every_coalition": True}),
        ("debate", {"method": "loo"}),
        ("majority_vote", {"method": "sampled", "budget": 6, "budget_unit": "coalitions", "seed": 3}),
    ],
)
def test_the_report_is_the_one_plays_held_in_memory_give(arun, priced, tmp_path, protocol, options):
    server, pool, examples = priced
    spec = build_protocol(protocol, MEMBERS)
    # A game given without a folder keeps its plays in memory (as a study's do): the reference.
    client = client_for(CallCache(tmp_path / "cache-a"))
    held = CoalitionGame(spec, pool, examples, client=client)
    in_memory = arun(play_audit(spec, pool, examples, client=client, game=held, **options))
    assert isinstance(held.plays, dict)
    logged = arun(
        play_audit(spec, pool, examples, client=client_for(CallCache(tmp_path / "cache-b")),
                   out=tmp_path / "out", plots=False, **options)
    )  # fmt: skip
    assert fields(logged) == fields(in_memory)
    assert logged.calls.made > 0 and logged.cost_usd and logged.cost_usd > 0  # priced calls were counted


def arithmetic_pool(scripted_server, names: list[str]) -> Pool:
    server = scripted_server(
        {m: arithmetic_solver(0.8 - 0.1 * i, seed=i, style=STYLES[i % 4]) for i, m in enumerate(names)}
    )
    return Pool.from_dict(
        {m: {"model": f"openai/{m}", "api_base": server.base_url, "api_key": "sk-t"} for m in names}
    )


def plays_alive() -> int:
    gc.collect()
    return sum(1 for o in gc.get_objects() if isinstance(o, Trace))


def test_the_plays_alive_are_bounded_by_the_examples_in_flight_not_by_the_dataset(
    arun, scripted_server, tmp_path
):
    names = ["m1", "m2", "m3", "m4"]
    pool = arithmetic_pool(scripted_server, names)
    examples = builtin_task("arithmetic", 60, seed=5)
    spec = build_protocol("majority_vote", names)
    client = client_for(CallCache(tmp_path / "cache"), concurrency=1)
    game = CoalitionGame(spec, pool, examples, client=client, store=tmp_path / "out")
    per_example = len(names) + 1 + len(names)  # leave-one-out coalitions and the grand one, each member alone
    in_flight = game.max_in_flight
    seen: list[int] = []
    recorded: dict[tuple[str, str], dict] = {}

    def progress(play: Trace) -> None:
        if len(recorded) < 12:  # a few plays as they were, to read back from the log after
            recorded[(coalition_id(play.game, play.coalition), play.example_id)] = play.model_dump()
        if len(seen) % 25 == 0:
            seen.append(plays_alive())
        else:
            seen.append(-1)

    before = plays_alive()
    report = arun(
        play_audit(spec, pool, examples, client=client, game=game, method="exact", on_progress=progress)
    )
    assert report.n_examples == len(examples) and report.shapley_estimator == "exact_from_answers"
    counts = [n - before for n in seen if n >= 0]
    total = len(examples) * per_example
    assert len(seen) == total and len(counts) >= 10
    # The examples in flight hold their plays (each play also in the list its example records together);
    # nothing else does.
    bound = 2 * in_flight * per_example
    assert max(counts) <= bound < total / 2, (max(counts), bound, total)
    assert plays_alive() - before <= 1  # once the report is made: none (the last one seen, at most)
    assert isinstance(game.plays, LoggedPlays) and len(game.plays) == total
    for key, play in recorded.items():
        back = game.plays[key].model_dump()
        assert {k: back[k] for k in ("example_id", "game", "coalition", "score", "answer", "failed")} == {
            k: play[k] for k in ("example_id", "game", "coalition", "score", "answer", "failed")
        }
        # The calls as the play saw them: the same requests, replies and tokens, cached where it was served.
        assert [(c["key"], c["completion"], c["cached"], c["usage"]) for c in back["calls"]] == [
            (c["key"], c["completion"], c["cached"], c["usage"]) for c in play["calls"]
        ]


def test_a_rerun_from_a_full_cache_sends_no_request_and_gives_the_same_report(arun, priced, tmp_path):
    server, pool, examples = priced
    spec = build_protocol("majority_vote", MEMBERS)
    cache = CallCache(tmp_path / "cache")
    first = arun(play_audit(spec, pool, examples, client=client_for(cache), method="exact",
                            out=tmp_path / "first", plots=False))  # fmt: skip
    sent = dict(server.request_counts())
    assert sum(sent.values()) == first.calls.made > 0
    rerun = arun(play_audit(spec, pool, examples, client=client_for(cache), method="exact",
                            out=tmp_path / "rerun", plots=False))  # fmt: skip
    assert server.request_counts() == sent
    assert rerun.calls.made == 0 and rerun.calls.cached == first.calls.made + first.calls.cached
    # Every use of a call is served from the cache now: what it saved is what the first run spent and saved.
    assert first.cost_usd and first.cost_saved_usd is not None
    assert rerun.cost_usd == 0.0 and rerun.cost_saved_usd == pytest.approx(
        first.cost_usd + first.cost_saved_usd
    )
    spent = WHEN | SPENT | {"per_coalition"}
    assert fields(rerun, spent) == fields(first, spent)
    # Each coalition needed the same calls and tokens (its price is of the calls made: none now).
    assert [c.model_dump(exclude={"cost_usd"}) for c in rerun.per_coalition] == [
        c.model_dump(exclude={"cost_usd"}) for c in first.per_coalition
    ]
    # Run again into the first folder: its log holds every play, nothing is played, the report is the same.
    again = arun(play_audit(spec, pool, examples, client=client_for(cache), method="exact",
                            out=tmp_path / "first", plots=False))  # fmt: skip
    assert server.request_counts() == sent
    assert fields(again) == fields(first)


def test_a_price_sum_kept_as_partials_is_math_fsum_of_the_prices_in_any_order():
    rng = random.Random(7)
    # Prices of very different sizes, the kind a running float sum gets wrong and an order changes.
    prices = [rng.choice([1e-7, 3e-6, 0.1, 2.5e-5, 1e-3]) * rng.random() for _ in range(2000)]
    prices += [1e16, -1e16, 1.0, 1e-16] * 3
    totals = set()
    for _ in range(3):
        rng.shuffle(prices)
        spend = Spend()
        for p in prices:
            spend.add(Call(member="m", model="x", messages=[], key="k", cost_usd=p))
        spend.settle()
        assert spend.cost_usd == math.fsum(prices)
        totals.add(spend.cost_usd)
    assert len(totals) == 1
