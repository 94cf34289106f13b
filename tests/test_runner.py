"""Running a protocol over a dataset through real HTTP: outputs, scores, failures, caching, secrets, resume."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

from colab_graphs.models.cache import CallCache
from colab_graphs.models.client import ModelClient
from colab_graphs.protocols.basic import majority_vote, solo
from colab_graphs.runner import RunError, run_dataset
from colab_graphs.tasks.example import Example
from colab_graphs.testing import arithmetic_solver
from colab_graphs.trace import read_traces

pytestmark = pytest.mark.integration

SECRET = "sk-SECRET-7f3a9c2e1b4d6f8a"


def examples(n: int = 4) -> list[Example]:
    return [Example(id=f"q{i}", input=f"What is {i} + {10 * i}?", answer=str(11 * i)) for i in range(n)]


def client(cache: CallCache | None = None, **kwargs: Any) -> ModelClient:
    return ModelClient(cache, backoff_s=0.01, retries=2, **kwargs)


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def failing_on(word: str, then: str = "The answer is 0."):
    """A script that raises (the server answers 500) when `word` is in the question."""

    def script(messages: list[dict[str, Any]], params: dict[str, Any]) -> str:
        if word in messages[-1]["content"]:
            raise RuntimeError("scripted crash")
        return then

    return script


def test_solo_run_writes_results_traces_and_summary(scripted_server, pool_for, arun, tmp_path) -> None:
    server = scripted_server({"a": arithmetic_solver(accuracy=1.0)})
    pool = pool_for(server, ["a"])
    outcomes, summary = arun(run_dataset(solo(pool.names), pool, examples(), client=client(), out=tmp_path))
    results = read_jsonl(tmp_path / "results.jsonl")
    assert [r["id"] for r in results] == ["q0", "q1", "q2", "q3"]
    assert results[1] == {
        "id": "q1",
        "input": "What is 1 + 10?",
        "gold": "11",
        "prediction": "11",
        "score": 1.0,
        "failed": False,
        "error": None,
        "output": "11",
        "answer": "11",  # deprecated: the prediction's old name, kept for one release
    }
    on_disk = json.loads((tmp_path / "summary.json").read_text())
    assert on_disk == summary
    assert summary["protocol"] == "solo" and summary["members"] == ["a"]
    assert (summary["score"], summary["n"], summary["failed"]) == (1.0, 4, 0)
    assert summary["calls"] == {"made": 4, "cached": 0, "failed": 0}
    assert summary["tokens"]["completion"] == 16 and summary["cost_usd"] is None
    assert summary["wall_s"] > 0
    traces = list(read_traces(tmp_path / "traces.jsonl"))
    assert [t.example_id for t in traces] == ["q0", "q1", "q2", "q3"]
    assert traces[2].calls[0].completion == "The answer is 22." and traces[2].score == 1.0
    assert traces[2].state == {"answer": "The answer is 22.", "final": "22"}


def test_majority_vote_scores_the_vote(scripted_server, pool_for, arun) -> None:
    server = scripted_server(
        {
            "right": arithmetic_solver(accuracy=1.0),
            "wrong": arithmetic_solver(accuracy=0.0, seed=1),
            "also_right": arithmetic_solver(accuracy=1.0, seed=2),
        }
    )
    pool = pool_for(server, ["wrong", "right", "also_right"])
    outcomes, summary = arun(run_dataset(majority_vote(pool.names), pool, examples(3), client=client()))
    assert summary["score"] == 1.0 and summary["calls"]["made"] == 9
    assert [o.answer for o in outcomes] == ["0", "11", "22"]
    assert all(sorted(c.member for c in o.trace.calls) == ["also_right", "right", "wrong"] for o in outcomes)


def test_second_run_is_served_from_the_cache(scripted_server, pool_for, arun, tmp_path) -> None:
    server = scripted_server({n: arithmetic_solver(seed=i) for i, n in enumerate("abc")})
    pool = pool_for(server, ["a", "b", "c"])
    spec = majority_vote(pool.names)
    _, first = arun(run_dataset(spec, pool, examples(), client=client(CallCache(tmp_path / "cache"))))
    assert len(server.requests) == 12
    server.reset()
    _, second = arun(run_dataset(spec, pool, examples(), client=client(CallCache(tmp_path / "cache"))))
    assert server.requests == []
    assert second["calls"] == {"made": 0, "cached": 12, "failed": 0}
    assert second["score"] == first["score"] and second["tokens"] == {"prompt": 0, "completion": 0}


def test_a_failed_call_fails_its_example_and_is_not_scored(scripted_server, pool_for, arun, tmp_path) -> None:
    server = scripted_server({"a": failing_on("2 + 20", then="The answer is 999.")})
    pool = pool_for(server, ["a"])
    data = [*examples(3), Example(id="x", input="What is 1 + 1?", answer="999")]
    outcomes, summary = arun(run_dataset(solo(pool.names), pool, data, client=client(), out=tmp_path))
    results = {r["id"]: r for r in read_jsonl(tmp_path / "results.jsonl")}
    assert results["q2"]["failed"] is True and results["q2"]["score"] is None
    assert "a: server after 3 attempt(s)" in results["q2"]["error"]
    assert (results["q0"]["failed"], results["q0"]["score"]) == (False, 0.0)  # wrong, not failed
    # the score averages the 3 examples that ran (1 right of 3), not 4
    assert (summary["n"], summary["scored"], summary["failed"]) == (4, 3, 1)
    assert summary["score"] == pytest.approx(1 / 3)
    assert summary["calls"]["failed"] == 1
    failed_trace = next(t for t in read_traces(tmp_path / "traces.jsonl") if t.example_id == "q2")
    assert failed_trace.failed and failed_trace.calls[0].error_type == "server"


def test_a_member_that_is_down_fails_every_example(scripted_server, pool_for, arun, tmp_path) -> None:
    server = scripted_server({"a": arithmetic_solver(), "b": arithmetic_solver(seed=1)}, down_models=["c"])
    pool = pool_for(server, ["a", "b", "c"])
    spec = majority_vote(pool.names)
    _, summary = arun(run_dataset(spec, pool, examples(2), client=client(), out=tmp_path))
    results = read_jsonl(tmp_path / "results.jsonl")
    assert [(r["failed"], r["score"], r["answer"]) for r in results] == [(True, None, None)] * 2
    assert all("c: server after 3 attempt(s)" in r["error"] for r in results)
    assert summary["failed"] == 2 and summary["score"] is None and summary["scored"] == 0
    # three attempts per example at the down member; a and b answered (or were cancelled) meanwhile
    assert sum(r.model == "c" for r in server.requests) == 6


def test_secrets_reach_no_output_file_nor_the_cache(scripted_server, pool_for, arun, tmp_path) -> None:
    server = scripted_server({"a": arithmetic_solver(), "b": failing_on("3 + 30")}, down_models=["gone"])
    pool = pool_for(server, ["a", "b", "gone"], api_key=SECRET)
    cache_dir = tmp_path / "cache"
    for i, spec in enumerate([majority_vote(["a", "b"]), majority_vote(pool.names)]):
        out = tmp_path / f"run{i}"
        arun(run_dataset(spec, pool, examples(), client=client(CallCache(cache_dir)), out=out))
    written = [p for p in tmp_path.rglob("*") if p.is_file()]
    names = {p.name for p in written}
    assert {"results.jsonl", "traces.jsonl", "summary.json", "calls.sqlite"} <= names
    assert any(b'"error_type":"server"' in p.read_bytes() for p in written if p.name == "traces.jsonl")
    leaks = [str(p) for p in written if SECRET.encode() in p.read_bytes() or b"SECRET" in p.read_bytes()]
    assert leaks == []


def test_an_interrupted_run_resumes_without_repeating_finished_examples(
    scripted_server, pool_for, arun, tmp_path
) -> None:
    server = scripted_server({"a": arithmetic_solver()})
    pool = pool_for(server, ["a"])
    spec, data = solo(pool.names), examples(6)

    async def interrupted() -> None:
        done: list[str] = []

        def on_progress(outcome) -> None:
            done.append(outcome.example_id)
            if len(done) == 2:
                run.cancel()  # as Ctrl-C would, while the third example may be in flight

        run = asyncio.ensure_future(
            run_dataset(
                spec,
                pool,
                data,
                client=client(),
                out=tmp_path,
                on_progress=on_progress,
                max_examples_in_flight=1,
            )
        )
        with pytest.raises(asyncio.CancelledError):
            await run

    arun(interrupted())
    finished = [r["id"] for r in read_jsonl(tmp_path / "results.jsonl")]
    assert len(finished) == 2
    server.reset()
    # no cache: only resume can spare the finished examples' calls
    outcomes, summary = arun(run_dataset(spec, pool, data, client=client(), out=tmp_path))
    asked = [r.messages[-1]["content"].split("\n")[0] for r in server.requests]
    assert len(asked) == 4 and not any(e.input in asked for e in data if e.id in finished)
    assert [r["id"] for r in read_jsonl(tmp_path / "results.jsonl")] == [e.id for e in data]
    assert [t.example_id for t in read_traces(tmp_path / "traces.jsonl")] == [e.id for e in data]
    assert summary["n"] == 6 and summary["score"] == 1.0


def test_a_different_run_in_the_same_directory_is_refused(scripted_server, pool_for, arun, tmp_path) -> None:
    server = scripted_server({"a": arithmetic_solver(), "b": arithmetic_solver()})
    pool = pool_for(server, ["a", "b"])
    arun(run_dataset(solo(pool.names), pool, examples(2), client=client(), out=tmp_path))
    with pytest.raises(RunError, match="holds a different run"):
        arun(run_dataset(solo(pool.names, member="b"), pool, examples(2), client=client(), out=tmp_path))
    _, summary = arun(
        run_dataset(
            solo(pool.names, member="b"), pool, examples(2), client=client(), out=tmp_path, overwrite=True
        )
    )
    assert summary["members"] == ["b"]


def test_a_template_error_stops_the_run_with_its_message(scripted_server, pool_for, arun) -> None:
    server = scripted_server({"a": "x"})
    pool = pool_for(server, ["a"])
    with pytest.raises(RunError, match="template variable 'topic'"):
        arun(run_dataset(solo(pool.names, prompt="{topic}"), pool, examples(1), client=client()))


def test_repeated_example_ids_are_refused(scripted_server, pool_for, arun) -> None:
    server = scripted_server({"a": "x"})
    pool = pool_for(server, ["a"])
    data = [*examples(2), Example(id="q1", input="again", answer="1")]
    with pytest.raises(RunError, match="repeated: q1"):
        arun(run_dataset(solo(pool.names), pool, data, client=client()))
    assert server.requests == []


def test_a_torn_last_trace_line_is_recomputed_on_resume(scripted_server, pool_for, arun, tmp_path) -> None:
    server = scripted_server({"a": arithmetic_solver()})
    pool = pool_for(server, ["a"])
    spec, data = solo(pool.names), examples(3)
    arun(run_dataset(spec, pool, data, client=client(), out=tmp_path))
    traces = tmp_path / "traces.jsonl"
    text = traces.read_text()
    traces.write_text(text[: len(text) - 40])  # killed while writing the last line
    server.reset()
    _, summary = arun(run_dataset(spec, pool, data, client=client(), out=tmp_path))
    assert [r.messages[-1]["content"].split("\n")[0] for r in server.requests] == [data[2].input]
    assert [t.example_id for t in read_traces(traces)] == ["q0", "q1", "q2"] and summary["n"] == 3


def test_a_corrupt_trace_line_is_named_by_file_and_line(tmp_path) -> None:
    path = tmp_path / "traces.jsonl"
    path.write_text('{"example_id": "1", "protocol": "p"}\n\n{"example_id": \n')
    reader = read_traces(path)
    assert next(reader).example_id == "1"
    with pytest.raises(ValueError, match=rf"{path}:3: not a valid trace record"):
        next(reader)
