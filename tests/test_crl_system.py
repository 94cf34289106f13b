"""The system a training run plays in: resolved as the CLI resolves it, evaluated as an audit plays it.

Collaborators and, in the evaluation tests, the policy seat itself are scripted members over real HTTP, so the
numbers are exact and no model is loaded.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from colab_graphs.builder import GraphBuilder
from colab_graphs.models.client import ModelClient
from colab_graphs.spec import END, START
from colab_graphs.tasks.example import Example
from colab_graphs.testing import arithmetic_solver
from colab_graphs.trainers import system
from colab_graphs.trainers.config import ConfigError, config_from_dict
from colab_graphs.trainers.evaluate import evaluate
from colab_graphs.trainers.rollout import LoopThread, PolicyRouter
from tests.conftest import server_pool

GREEDY = {"temperature": 0.0, "top_p": 1.0, "max_tokens": 32}


def _pool_file(path: Path) -> Path:
    path.write_text(
        "models:\n"
        "  a: {model: openai/a, api_key: sk-x, description: adds numbers,"
        " deployments: [{api_base: 'http://127.0.0.1:9/v1'}, {api_base: 'http://127.0.0.1:10/v1'}]}\n"
        "  b: {model: openai/b, api_key: sk-x, description: writes poems}\n"
        "  policy: {model: openai/p, description: the trained one}\n"
    )
    return path


# --- resolution ----------------------------------------------------------------------------------------------


def test_prompt_routing_in_training_shows_the_router_the_pools_descriptions(tmp_path: Path) -> None:
    config = config_from_dict({"protocol": "prompt_routing", "pool": str(_pool_file(tmp_path / "pool.yaml"))})
    pool = system.build_pool(config)
    spec = system.build_spec(config, pool)
    router = next(n for n in spec.nodes if n.name == "router")
    assert "- a: adds numbers\n- b: writes poems\n- policy: the trained one" in router.prompt


def test_a_collaborators_deployments_from_the_pool_file_are_kept(tmp_path: Path) -> None:
    config = config_from_dict({"pool": str(_pool_file(tmp_path / "pool.yaml"))})
    pool = system.build_pool(config)
    assert len(pool["a"].deployments) == 2
    assert pool["policy"].model == f"local/{system.POLICY_PREFIX}policy"


def test_a_protocol_that_cannot_be_built_names_the_field() -> None:
    config = config_from_dict({"protocol": "prompt_routing", "protocol_params": {"router": "nobody"}})
    pool = system.build_pool(config)
    with pytest.raises(ConfigError, match=r"^protocol: .*nobody"):
        system.build_spec(config, pool)


def test_a_graph_file_that_is_missing_names_the_graph_field(tmp_path: Path) -> None:
    config = config_from_dict({"graph": str(tmp_path / "nowhere.py:relay")})
    with pytest.raises(ConfigError, match=r"^graph: .*nowhere\.py does not exist"):
        system.build_spec(config, system.build_pool(config))


# --- evaluation ----------------------------------------------------------------------------------------------


def _evaluate(spec, pool, examples, scorer="numeric") -> dict:  # noqa: ANN001
    router = PolicyRouter(ModelClient(None), ["policy"], GREEDY)
    return evaluate(spec, pool, examples, router, "policy", LoopThread.shared(), scorer)


@pytest.mark.integration
def test_the_policy_seats_loo_and_solo_score_are_the_audits(scripted_server) -> None:
    from colab_graphs.audit.run import play_audit
    from colab_graphs.protocol_registry import build_protocol
    from colab_graphs.tasks.builtin import builtin_task

    server = scripted_server(
        {
            "a": arithmetic_solver(accuracy=0.9, seed=1),
            "b": arithmetic_solver(accuracy=0.3, seed=2),
            "policy": arithmetic_solver(accuracy=0.6, seed=3),
        }
    )
    pool = server_pool(server, ["a", "b", "policy"])
    spec = build_protocol("majority_vote", pool.names)
    examples = builtin_task("arithmetic", n=12)
    result = _evaluate(spec, pool, examples)
    report = LoopThread.shared().run(
        play_audit(
            spec, pool, examples, client=ModelClient(None), method="loo", scorer="numeric", plots=False
        )
    )
    assert result["loo"] == pytest.approx(report.loo["policy"])
    assert result["policy_solo"] == pytest.approx(report.individual["policy"])
    assert result["loo"] == pytest.approx(result["system"] - result["without_policy"])
    assert (result["n"], result["failed"]) == (12, 0)


@pytest.mark.integration
def test_without_the_policy_the_protocols_empty_fallback_is_scored(scripted_server) -> None:
    """The policy is the only member: without it the coalition is empty and answers the fallback, "1"."""
    server = scripted_server({"policy": arithmetic_solver(accuracy=0.0)})
    pool = server_pool(server, ["policy"])
    b = GraphBuilder("alone_or_fallback", members=["policy"])
    b.seat("answer", member="policy", prompt="{input}", writes="answer")
    spec = b.edge(START, "answer").edge("answer", END).output("answer").empty_fallback("1").build()
    examples = [Example(id=f"q{i}", input=f"What is {i} + {1 - i}?", answer="1") for i in range(3)]
    result = _evaluate(spec, pool, examples)
    assert (result["system"], result["without_policy"], result["loo"]) == (0.0, 1.0, -1.0)
