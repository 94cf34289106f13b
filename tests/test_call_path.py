"""The one call path through real HTTP: cache, single-flight, concurrency limit, retries, failures, traces."""

from __future__ import annotations

import asyncio
import os
import sys
from typing import Any

import pytest

from colab_graphs.models.cache import CallCache
from colab_graphs.models.client import CallError, ModelClient
from colab_graphs.pool import Pool
from colab_graphs.testing import Member, echo
from colab_graphs.trace import Trace

pytestmark = pytest.mark.integration


def ask(text: str = "What is 2 + 2?") -> list[dict[str, Any]]:
    return [{"role": "user", "content": text}]


def fast_client(cache: CallCache | None = None, **kwargs: Any) -> ModelClient:
    return ModelClient(cache, backoff_s=0.01, **kwargs)


def test_results_carry_text_usage_latency_and_attempts(scripted_server, pool_for, arun) -> None:
    server = scripted_server({"a": "The answer is 4."})
    result = arun(fast_client().complete(pool_for(server, ["a"])["a"], ask()))
    assert result.text == "The answer is 4."
    assert (result.usage.prompt_tokens, result.usage.completion_tokens) == (5, 4)  # words, as scripted
    assert result.attempts == 1 and not result.cached and result.latency_s > 0
    assert result.cost_usd is None  # LiteLLM has no price for a scripted model: null, not 0


def test_cost_is_recorded_for_priced_models(scripted_server, arun) -> None:
    import litellm

    server = scripted_server({"gpt-4o-mini": "The answer is 4."})
    pool = Pool.from_dict({"m": {"model": "openai/gpt-4o-mini", "api_base": server.base_url, "api_key": "k"}})
    result = arun(fast_client().complete(pool["m"], ask()))
    prompt_price, completion_price = litellm.cost_per_token(
        "gpt-4o-mini", prompt_tokens=5, completion_tokens=4
    )
    assert result.cost_usd == pytest.approx(prompt_price + completion_price) and result.cost_usd > 0


def test_second_client_on_the_same_cache_makes_no_requests(scripted_server, pool_for, arun, tmp_path) -> None:
    server = scripted_server({"a": echo()})
    member = pool_for(server, ["a"])["a"]
    first = fast_client(CallCache(tmp_path / "c"))
    texts = [arun(first.complete(member, ask(f"q{i}"))).text for i in range(3)]
    server.reset()
    again = fast_client(CallCache(tmp_path / "c"))  # a new process would open the same file
    results = [arun(again.complete(member, ask(f"q{i}"))) for i in range(3)]
    assert server.requests == []
    assert [r.text for r in results] == texts and all(r.cached for r in results)
    assert again.stats.as_dict() == {"made": 0, "unique": 3, "cached": 3, "failed": 0, "attempts": 0}


def test_cache_memory_copy_is_bounded_independent_and_cleared(tmp_path, monkeypatch) -> None:
    """Stored calls are also kept in memory (fewer SQLite reads); that copy must never change what is read."""
    from colab_graphs.models import cache as cache_module

    monkeypatch.setattr(cache_module, "MEMORY_ENTRIES", 2)
    cache = CallCache(tmp_path / "c")
    for i in range(3):
        cache.put(f"k{i}", "m", {"q": i}, {"text": f"a{i}", "ids": [i]})
    assert list(cache._recent) == ["k1", "k2"]  # the oldest dropped from memory...
    assert cache.get("k0") == {"text": "a0", "ids": [0]}  # ...but still on disk
    hit = cache.get("k1")
    hit["ids"].append(99)  # a caller mutating its copy does not change the stored entry
    assert cache.get("k1") == {"text": "a1", "ids": [1]}
    assert CallCache(tmp_path / "c").get("k2") == {"text": "a2", "ids": [2]}  # another process sees it
    assert cache.clear() == 3
    assert cache.get("k1") is None and cache.get("k2") is None


def _open_cache_at_the_barrier(directory: str, barrier: Any, results: Any) -> None:
    barrier.wait()
    try:
        cache = CallCache(directory)
        me = str(os.getpid())
        cache.put(me, "m", {"q": me}, {"text": me})
        results.put("ok" if cache.get(me) == {"text": me} else "not read back")
    except Exception as exc:  # noqa: BLE001 (the test reports whatever happened)
        results.put(f"{type(exc).__name__}: {exc}")


@pytest.mark.slow
def test_processes_opening_one_new_cache_at_once_all_get_it(tmp_path) -> None:
    """The ranks of `accelerate launch` (and study workers on one machine) open one new cache file together;
    SQLite refused the loser of the race to WAL mode at once ("database is locked") in 18 of 120 opens."""
    import multiprocessing

    ctx = multiprocessing.get_context("spawn" if sys.platform == "darwin" else "fork")
    failures = []
    for i in range(20):
        barrier, results = ctx.Barrier(3), ctx.Queue()
        procs = [
            ctx.Process(target=_open_cache_at_the_barrier, args=(str(tmp_path / str(i)), barrier, results))
            for _ in range(3)
        ]
        for proc in procs:
            proc.start()
        outcomes = [results.get(timeout=60) for _ in procs]
        for proc in procs:
            proc.join(timeout=60)
        failures += [o for o in outcomes if o != "ok"]
    assert failures == []


def test_cache_key_ignores_how_an_endpoint_is_reached(scripted_server, arun, tmp_cache) -> None:
    server = scripted_server({"a": echo()})
    client = fast_client(tmp_cache)
    base = server.base_url
    plain = Pool.from_dict({"a": {"model": "openai/a", "api_base": base, "api_key": "sk-key-one-1"}})
    # Another key, a timeout, a trailing slash, an upper-case scheme and host: the same server answers.
    reached_otherwise = Pool.from_dict(
        {"a": {"model": "openai/a", "api_base": base.replace("http://", "HTTP://") + "/", "timeout": 9,
               "api_key": "sk-key-two-2"}}
    )  # fmt: skip
    first = arun(client.complete(plain["a"], ask()))
    again = arun(client.complete(reached_otherwise["a"], ask()))
    assert again.cached and again.text == first.text
    assert sum(server.request_counts().values()) == 1


def test_cache_key_tells_two_servers_of_one_model_name_apart(scripted_server, arun, tmp_cache) -> None:
    one, two = scripted_server({"a": "from one"}), scripted_server({"a": "from two"})
    client = fast_client(tmp_cache)
    via_one = Pool.from_dict({"a": {"model": "openai/a", "api_base": one.base_url, "api_key": "k"}})
    via_two = Pool.from_dict({"a": {"model": "openai/a", "api_base": two.base_url, "api_key": "k"}})
    assert arun(client.complete(via_one["a"], ask())).text == "from one"
    assert arun(client.complete(via_two["a"], ask())).text == "from two"
    assert arun(client.complete(via_one["a"], ask())).cached


def test_a_shared_cache_namespace_shares_entries_across_servers(scripted_server, arun, tmp_cache) -> None:
    """A user who moved a model to another server says so; bumping the namespace separates again."""
    one, two = scripted_server({"a": "from one"}), scripted_server({"a": "from two"})
    client = fast_client(tmp_cache)

    def member(server, namespace):
        settings = {
            "model": "openai/a",
            "api_base": server.base_url,
            "api_key": "k",
            "cache_namespace": namespace,
        }
        return Pool.from_dict({"a": settings})["a"]

    assert arun(client.complete(member(one, "ada-v1"), ask())).text == "from one"
    assert arun(client.complete(member(two, "ada-v1"), ask())).text == "from one"
    assert arun(client.complete(member(two, "ada-v2"), ask())).text == "from two"
    assert two.request_counts() and sum(two.request_counts().values()) == 1


@pytest.mark.parametrize(
    "change",
    [
        {"temperature": 0.9},
        {"system_prompt": "You are terse."},
        {"model": "openai/b"},
    ],
)
def test_cache_key_includes_what_shapes_the_output(scripted_server, arun, tmp_cache, change) -> None:
    server = scripted_server({"a": "x", "b": "y"})
    base = {"model": "openai/a", "api_base": server.base_url, "api_key": "sk-test", "temperature": 0.0}
    pool = Pool.from_dict({"base": base, "changed": {**base, **change}})
    client = fast_client(tmp_cache)
    arun(client.complete(pool["base"], ask()))
    assert not arun(client.complete(pool["changed"], ask())).cached
    assert len(server.requests) == 2


def test_persona_is_sent_as_the_system_message(scripted_server, arun) -> None:
    server = scripted_server({"a": "ok"})
    pool = Pool.from_dict(
        {
            "a": {
                "model": "openai/a",
                "api_base": server.base_url,
                "api_key": "k",
                "system_prompt": "Be brief.",
            }
        }
    )
    client = fast_client()
    arun(client.complete(pool["a"], ask("q1")))
    arun(client.complete(pool["a"], [{"role": "system", "content": "Seat role."}, *ask("q2")]))
    assert [r.messages for r in server.requests] == [
        [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "q1"}],
        [{"role": "system", "content": "Be brief.\n\nSeat role."}, {"role": "user", "content": "q2"}],
    ]


def test_identical_concurrent_requests_share_one_server_call(scripted_server, pool_for, arun) -> None:
    server = scripted_server({"a": "shared"}, latency_s=0.3)
    member = pool_for(server, ["a"])["a"]
    client = fast_client()  # no cache: only single-flight can share

    async def many():
        return await asyncio.gather(*(client.complete(member, ask()) for _ in range(8)))

    results = arun(many())
    assert len(server.requests) == 1
    assert [r.text for r in results] == ["shared"] * 8
    assert sum(not r.cached for r in results) == 1
    assert (client.stats.made, client.stats.cached) == (1, 7)


def test_cancelled_flight_owner_does_not_cancel_its_waiters(scripted_server, pool_for, arun) -> None:
    # In an audit, a sibling seat's failure cancels a graph branch while another coalition waits on the same
    # request: the waiter must still get its answer, not a CancelledError it never asked for.
    server = scripted_server({"a": "answer"}, latency_s=0.4)
    member = pool_for(server, ["a"])["a"]
    client = fast_client()

    async def scenario():
        owner = asyncio.ensure_future(client.complete(member, ask()))
        await asyncio.sleep(0.1)
        waiter = asyncio.ensure_future(client.complete(member, ask()))
        await asyncio.sleep(0.1)
        owner.cancel()
        result = await waiter
        return owner, result

    owner, result = arun(scenario())
    assert owner.cancelled()
    assert result.text == "answer"


def test_cancelled_waiter_does_not_cancel_the_shared_call(scripted_server, pool_for, arun) -> None:
    server = scripted_server({"a": "answer"}, latency_s=0.3)
    member = pool_for(server, ["a"])["a"]
    client = fast_client()

    async def scenario():
        owner = asyncio.ensure_future(client.complete(member, ask()))
        waiter = asyncio.ensure_future(client.complete(member, ask()))
        await asyncio.sleep(0.1)
        waiter.cancel()
        return waiter, await owner

    waiter, result = arun(scenario())
    assert waiter.cancelled() and result.text == "answer" and len(server.requests) == 1


def test_sample_index_keeps_repeated_samples_distinct(scripted_server, arun, tmp_cache) -> None:
    server = scripted_server({"a": "s"})
    pool = Pool.from_dict(
        {"a": {"model": "openai/a", "api_base": server.base_url, "api_key": "k", "seed": 7}}
    )
    client = fast_client(tmp_cache)
    keys = [arun(client.complete(pool["a"], ask(), sample=k)).key for k in range(3)]
    assert len(set(keys)) == 3
    assert [r.params["seed"] for r in server.requests] == [7, 8, 9]
    again = [arun(client.complete(pool["a"], ask(), sample=k)) for k in range(3)]
    assert [r.key for r in again] == keys and all(r.cached for r in again)
    assert len(server.requests) == 3


@pytest.mark.parametrize("kind", ["429", "500", "malformed", "drop"])
def test_transient_failures_are_retried_until_success(scripted_server, pool_for, arun, kind) -> None:
    server = scripted_server({"a": "The answer is 4."}, fail_first=2, fail_first_kind=kind)
    client = fast_client(retries=3)
    result = arun(client.complete(pool_for(server, ["a"])["a"], ask()))
    assert result.text == "The answer is 4." and result.attempts == 3
    assert [r.fault for r in server.requests] == [kind, kind, None]
    assert (client.stats.made, client.stats.attempts, client.stats.failed) == (1, 3, 0)


def test_timeouts_are_retried(scripted_server, pool_for, arun) -> None:
    server = scripted_server({"a": "late"}, fail_first=1, fail_first_kind="timeout", timeout_hold_s=3.0)
    client = fast_client(timeout_s=0.5)
    result = arun(client.complete(pool_for(server, ["a"])["a"], ask()))
    assert result.text == "late" and result.attempts == 2


@pytest.mark.parametrize(
    ("fault", "kind"), [("429", "rate_limit"), ("500", "server"), ("malformed", "malformed")]
)
def test_exhausted_retries_raise_a_typed_error(scripted_server, pool_for, arun, fault, kind) -> None:
    server = scripted_server({"a": "never"}, fail_first=10, fail_first_kind=fault)
    trace = Trace(example_id="1", protocol="p")
    client = fast_client(retries=2)
    with pytest.raises(CallError) as err:
        arun(client.complete(pool_for(server, ["a"])["a"], ask(), trace=trace, seat="s"))
    assert (err.value.kind, err.value.attempts, err.value.member) == (kind, 3, "a")
    assert len(server.requests) == 3
    (call,) = trace.calls
    assert (call.error_type, call.attempts, call.completion, call.seat) == (kind, 3, None, "s")
    assert client.stats.failed == 1


def test_a_down_member_fails_after_every_retry(scripted_server, arun) -> None:
    server = scripted_server({"a": "ok"}, down_models=["gone"])
    pool = Pool.from_dict({"gone": {"model": "openai/gone", "api_base": server.base_url, "api_key": "k"}})
    with pytest.raises(CallError, match="gone: server after 4 attempt") as err:
        arun(fast_client(retries=3).complete(pool["gone"], ask()))
    assert err.value.kind == "server" and len(server.requests) == 4


def test_permanent_errors_are_not_retried(scripted_server, arun) -> None:
    server = scripted_server({"a": "ok"})
    pool = Pool.from_dict({"nope": {"model": "openai/nope", "api_base": server.base_url, "api_key": "k"}})
    with pytest.raises(CallError) as err:
        arun(fast_client(retries=3).complete(pool["nope"], ask()))
    assert (err.value.kind, err.value.attempts) == ("not_found", 1)
    assert len(server.requests) == 1


def test_failed_calls_are_not_cached(scripted_server, pool_for, arun, tmp_cache) -> None:
    server = scripted_server({"a": "finally"}, fail_first=2, fail_first_kind="500")
    member = pool_for(server, ["a"])["a"]
    with pytest.raises(CallError):
        arun(fast_client(tmp_cache, retries=1).complete(member, ask()))
    assert tmp_cache.stats()["entries"] == 0
    assert arun(fast_client(tmp_cache, retries=1).complete(member, ask())).text == "finally"


def test_concurrency_is_limited_per_endpoint(scripted_server, pool_for, arun) -> None:
    server = scripted_server({"a": echo()}, latency_s=0.25)
    member = pool_for(server, ["a"])["a"]
    client = fast_client(max_concurrency=2)

    async def many():
        await asyncio.gather(*(client.complete(member, ask(f"q{i}")) for i in range(6)))

    arun(many())
    spans = [(r.time, r.time + r.duration_s) for r in server.requests]
    most = max(sum(1 for s, e in spans if s <= t < e) for t, _ in spans)
    assert len(spans) == 6 and most == 2


def test_trace_records_every_call_cached_or_not(scripted_server, arun, tmp_cache) -> None:
    server = scripted_server({"a": Member("hi", confidence=0.5)})
    pool = Pool.from_dict(
        {
            "a": {
                "model": "openai/a",
                "api_base": server.base_url,
                "api_key": "sk-SECRET-abcdef",
                "max_tokens": 9,
            }
        }
    )
    trace = Trace(example_id="e1", protocol="p")
    client = fast_client(tmp_cache)
    for _ in range(2):
        arun(client.complete(pool["a"], ask(), node="n", seat="s", trace=trace, overrides={"logprobs": True}))
    first, second = trace.calls
    assert (first.cached, second.cached) == (False, True)
    assert first.key == second.key and first.member == "a" and first.model == "openai/a"
    assert first.settings == {"max_tokens": 9, "logprobs": True}
    assert first.completion == second.completion == "hi" and first.usage.completion_tokens == 1
    assert first.logprobs == pytest.approx([-0.6931471805599453])
    assert second.logprobs == first.logprobs  # logprobs survive the cache
    assert "SECRET" not in trace.model_dump_json()
