"""What `colab-graphs audit` has loaded when it sends its first request: what the request needs, not LiteLLM
(calls to an OpenAI-compatible server go direct, at a price the pool gives or the cache remembers), LangGraph
(an audit plays its fused protocols without it), the plotting library, torch or the viewer.

The command runs in a fresh interpreter against the scripted server; a wrapper around the direct lane's `post`
writes the loaded modules down when the first request goes out, and passes the request on.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from conftest import write_pool_file

pytestmark = pytest.mark.integration

AT_FIRST_REQUEST = textwrap.dedent(
    """
    import json, runpy, sys
    import colab_graphs.models.direct as direct

    posted, loaded, record = direct.post, {}, sys.argv[1]

    async def post(request):
        if not loaded:
            loaded["modules"] = sorted(sys.modules)
            with open(record, "w") as out:
                json.dump(loaded["modules"], out)
        return await posted(request)

    direct.post = post
    sys.argv = ["colab-graphs", *sys.argv[2:]]
    runpy.run_module("colab_graphs.cli.app", run_name="__main__")
    """
)
NOT_BEFORE_THE_FIRST_REQUEST = [
    "langgraph",  # an audit runs its fused protocols without LangGraph (`compile.DirectGraph`)
    "langchain_core",
    "litellm",
    "openai",
    "matplotlib",
    "torch",
    "transformers",
    "networkx",
    "colab_graphs.viewer",
]


def audit_recording_modules(tmp_path, pool, out: str, limit: int = 4) -> set[str]:
    """Run `colab-graphs audit`; the modules it had loaded when it sent its first request."""
    record = tmp_path / f"{out}.modules.json"
    command = [sys.executable, "-c", AT_FIRST_REQUEST, str(record), "audit", "--protocol", "majority_vote",
               "--pool", str(pool), "--data", "builtin:arithmetic", "--limit", str(limit),
               "--out", str(tmp_path / out), "--cache-dir", str(tmp_path / "cache")]  # fmt: skip
    proc = subprocess.run(command, capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert (tmp_path / out / "contributions.png").is_file()  # the plots are still drawn, after the calls
    return set(json.loads(record.read_text()))


@pytest.mark.parametrize("priced", [True, False], ids=["priced-in-the-pool", "a-served-model-with-no-price"])
def test_the_audit_command_loads_no_litellm_plots_or_torch_before_its_first_request(
    scripted_server, tmp_path, priced
):
    """Also on a first audit (an empty cache) of a served model that LiteLLM's map does not price: its price is
    known to be unknown without loading LiteLLM."""
    from colab_graphs.testing import arithmetic_solver

    names = ["a", "b", "c"]
    server = scripted_server({m: arithmetic_solver(accuracy=0.7, seed=i) for i, m in enumerate(names)})
    pool = write_pool_file(tmp_path / "pool.yaml", server, names)
    if priced:
        pool.write_text(
            pool.read_text().replace("}", ", input_cost_per_token: 1.0e-7, output_cost_per_token: 2.0e-7}")
        )
    loaded = audit_recording_modules(tmp_path, pool, "audit")
    assert "httpx" in loaded and "yaml" in loaded  # (what the command needs is there)
    assert [name for name in NOT_BEFORE_THE_FIRST_REQUEST if name in loaded] == []
    report = json.loads((tmp_path / "audit" / "report.json").read_text())
    assert (report["cost_usd"] is None) is (not priced)  # an unknown price stays unknown, never free


def served_as_priced_model(scripted_server, tmp_path):
    """A pool of a served model named as one LiteLLM prices ("gpt-4o-mini") and a member priced at 0."""
    from colab_graphs.testing import arithmetic_solver

    names = ["gpt-4o-mini", "b"]
    server = scripted_server({m: arithmetic_solver(accuracy=0.7, seed=i) for i, m in enumerate(names)})
    pool = write_pool_file(tmp_path / "pool.yaml", server, names)
    free = "b, input_cost_per_token: 0.0, output_cost_per_token: 0.0, api_base"
    pool.write_text(pool.read_text().replace("b, api_base", free))
    return pool


def run_recording_modules(tmp_path, command: list[str]) -> list[str]:
    record = tmp_path / "modules.json"
    proc = subprocess.run([sys.executable, "-c", AT_FIRST_REQUEST, str(record), *command], capture_output=True,
                          text=True, timeout=600, cwd=tmp_path)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(record.read_text())


def test_a_price_looked_up_beside_the_calls_is_settled_in_every_call_record(scripted_server, tmp_path):
    """A member LiteLLM prices: the first request does not wait for the look-up (which loads LiteLLM), yet
    every call's cost, at LiteLLM's price, is in its record and in the summary."""
    pool = served_as_priced_model(scripted_server, tmp_path)
    run_recording_modules(tmp_path, ["run", "--protocol", "majority_vote", "--pool", str(pool), "--data",
                                     "builtin:arithmetic", "--limit", "3", "--out", str(tmp_path / "run"),
                                     "--cache-dir", str(tmp_path / "cache")])  # fmt: skip
    import litellm

    info = litellm.get_model_info("openai/gpt-4o-mini")
    traces = [json.loads(line) for line in (tmp_path / "run" / "traces.jsonl").read_text().splitlines()]
    calls = [c for t in traces for c in t["calls"] if c["member"] == "gpt-4o-mini"]
    assert len(calls) == 3
    for call in calls:
        usage = call["usage"]
        want = info["input_cost_per_token"] * usage["prompt_tokens"]
        want += info["output_cost_per_token"] * usage["completion_tokens"]
        assert want > 0 and call["cost_usd"] == pytest.approx(want, rel=1e-9)
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["cost_usd"] == pytest.approx(sum(c["cost_usd"] for c in calls), rel=1e-9)


def test_a_cost_cap_has_the_price_before_the_first_call(scripted_server, tmp_path):
    pool = served_as_priced_model(scripted_server, tmp_path)
    loaded = run_recording_modules(tmp_path, ["audit", "--protocol", "majority_vote", "--pool", str(pool),
                                              "--data", "builtin:arithmetic", "--limit", "2", "--max-cost", "5",
                                              "--out", str(tmp_path / "audit"), "--cache-dir",
                                              str(tmp_path / "cache")])  # fmt: skip
    assert "litellm" in loaded
    assert json.loads((tmp_path / "audit" / "report.json").read_text())["cost_usd"] > 0


def test_the_bundled_price_map_is_never_read_as_unpriced_for_a_model_it_names():
    """`pricing.unmapped` decides "no price" without LiteLLM: it must never say so for a name LiteLLM could
    match (every key of the map, with a provider prefix, a dated snapshot or a fine-tune name around it), and
    it must say so, as LiteLLM does, for served names the map has nothing like."""
    from colab_graphs.models import pricing

    names = pricing._bundled_names()
    assert names is not None and len(names) > 1000
    import litellm

    # The bundled map's own keys (litellm.model_cost may also hold prices other tests registered).
    bundled = Path(litellm.__file__).parent / "model_prices_and_context_window_backup.json"
    keys = list(json.loads(bundled.read_text(encoding="utf-8")))
    variants = [
        v for k in keys for v in (k, f"openai/{k}", f"{k}-2024-08-06", f"ft:{k}:org:suffix:id", k.upper())
    ]
    assert [v for v in variants if pricing.no_key_matches(v)] == []
    assert not pricing.unmapped("openai/m0")  # (LiteLLM is loaded here: it decides)
    served = ["openai/m0", "openai/my-served-model", "hosted_vllm/policy", "openai/solver"]
    for model in served:
        assert pricing.no_key_matches(model)
        with pytest.raises(Exception):  # noqa: B017,PT011 - LiteLLM raises for a model it has not mapped
            litellm.get_model_info(model)
