"""Logit-level protocols: fusion and contrastive decoding through the graph, on the tiny local model.

The model tests (marked slow: loading torch and the tiny model takes 10-20 s here) compare each protocol's
output with what the local provider's decoders produce directly, so they check that the graph sends the
right members, mode and parameters. The pool checks need no model.
"""

from __future__ import annotations

import copy

import pytest

from colab_graphs.coalition import restrict
from colab_graphs.compile import compile_graph
from colab_graphs.models.client import ModelClient
from colab_graphs.pool import Pool
from colab_graphs.protocol_registry import build_protocol, get_protocol
from colab_graphs.protocols.logit import LogitPoolError, check_pool_supports
from colab_graphs.runner import run_dataset
from colab_graphs.tasks.example import Example

TINY = "tiny-random"
WEAK = "tiny-random-weak"  # the same architecture and tokenizer, perturbed weights
GREEDY = {"temperature": 0, "max_tokens": 10}


def run_one(arun, spec, pool, question: str = "What is 2 + 2?"):
    example = Example(id="q", input=question, answer="4")
    outcomes, _ = arun(run_dataset(spec, pool, [example], client=ModelClient(None)))
    assert not outcomes[0].failed, outcomes[0].error
    return outcomes[0]


def local_pool(**models: str) -> Pool:
    return Pool.from_dict({name: {"model": f"local/{model}", **GREEDY} for name, model in models.items()})


@pytest.fixture(scope="module")
def weak_model():
    """Serve a perturbed copy of the tiny model as local/tiny-random-weak (same vocabulary, other logits)."""
    import torch

    from colab_graphs.local.provider import get_engine, set_local_model, unload

    engine = get_engine(TINY)
    model = copy.deepcopy(engine.model)
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=generator) * 0.5)
    set_local_model(WEAK, model, engine.tokenizer)
    yield WEAK
    unload(WEAK)


def test_logit_protocols_are_registered_as_needing_local_logits():
    for name in ("logit_fusion", "contrastive_decoding"):
        info = get_protocol(name)
        assert (info.family, info.requires) == ("logit", ["local_logits"])


@pytest.mark.slow
def test_fusion_of_a_model_with_itself_equals_its_greedy_output(arun):
    pool = local_pool(a=TINY, b=TINY)
    fused = run_one(arun, build_protocol("logit_fusion", ["a", "b"]), pool)
    alone = run_one(arun, build_protocol("solo", ["a", "b"]), pool)
    assert fused.trace.state["fused"] == alone.trace.state["answer"]
    [call] = fused.trace.calls
    assert call.settings["metadata"]["colab_graphs"] == {
        "logit_mode": "fusion",
        "members": [f"local/{TINY}", f"local/{TINY}"],
    }


@pytest.mark.slow
def test_fusion_decodes_from_both_members_distributions(arun, weak_model):
    from colab_graphs.local.logits import logit_fusion

    pool = local_pool(a=TINY, b=weak_model)
    outcome = run_one(arun, build_protocol("logit_fusion", ["a", "b"]), pool)
    [call] = outcome.trace.calls
    direct = logit_fusion([TINY, weak_model], call.messages, max_tokens=10, temperature=0.0)
    assert outcome.trace.state["fused"] == direct.text


@pytest.mark.slow
@pytest.mark.parametrize("kept", ["a", "b"])
def test_fusion_coalition_of_one_is_plain_generation(arun, weak_model, kept):
    pool = local_pool(a=TINY, b=weak_model)
    spec = restrict(build_protocol("logit_fusion", ["a", "b"]), [kept])
    outcome = run_one(arun, spec, pool)
    alone = run_one(arun, build_protocol("solo", ["a", "b"], member=kept), pool)
    [call] = outcome.trace.calls
    assert "metadata" not in call.settings
    assert call.model == pool[kept].model
    assert outcome.trace.state["fused"] == alone.trace.state["answer"]


@pytest.mark.slow
@pytest.mark.parametrize(("alpha", "beta"), [(0.1, 1.0), (0.5, 0.3)])
def test_contrastive_decoding_passes_strong_weak_and_parameters(arun, weak_model, alpha, beta):
    from colab_graphs.local.logits import contrastive_decoding

    pool = local_pool(weak=weak_model, strong=TINY)
    spec = build_protocol("contrastive_decoding", ["weak", "strong"], alpha=alpha, beta=beta)
    outcome = run_one(arun, spec, pool)
    [call] = outcome.trace.calls
    assert call.model == f"local/{TINY}"  # the strong member makes the request
    expected = contrastive_decoding(
        TINY, weak_model, call.messages, alpha=alpha, beta=beta, max_tokens=10, temperature=0.0
    )
    assert outcome.trace.state["contrast"] == expected.text


@pytest.mark.slow
@pytest.mark.parametrize(("removed", "kept"), [("weak", "strong"), ("strong", "weak")])
def test_contrastive_without_one_member_is_the_others_plain_generation(arun, weak_model, removed, kept):
    pool = local_pool(weak=weak_model, strong=TINY)
    spec = restrict(build_protocol("contrastive_decoding", ["weak", "strong"]), [kept])
    outcome = run_one(arun, spec, pool)
    alone = run_one(arun, build_protocol("solo", ["weak", "strong"], member=kept), pool)
    [call] = outcome.trace.calls
    assert (call.member, "metadata" in call.settings) == (kept, False)
    assert outcome.trace.state["contrast"] == alone.trace.state["answer"]


def test_contrastive_defaults_to_first_as_weak_and_last_as_strong():
    spec = build_protocol("contrastive_decoding", ["small", "middle", "large"])
    assert spec.members == ["small", "large"]  # the middle member takes no part
    assert spec.node("contrast").members == ["large", "small"]  # [strong, weak], as the provider takes them


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({"strong": "a", "weak": "a"}, "strong and weak are both 'a'"),
        ({"strong": "zed"}, "'zed' not in the pool"),
        ({"alpha": 0.0}, "alpha must be in"),
    ],
)
def test_contrastive_rejects_bad_parameters(params, message):
    with pytest.raises(ValueError, match=message):
        build_protocol("contrastive_decoding", ["a", "b"], **params)


# --- pools that cannot run logit-level protocols --------------------------------------------------------------


def api_pool(server_url: str = "http://127.0.0.1:9/v1", **models: str) -> Pool:
    return Pool.from_dict(
        {
            name: {"model": model, "api_base": server_url, "api_key": "sk-test"}
            if not model.startswith("local/")
            else {"model": model}
            for name, model in models.items()
        }
    )


@pytest.mark.parametrize("name", ["logit_fusion", "contrastive_decoding"])
def test_api_pool_is_refused_naming_each_member_and_model(name):
    pool = api_pool(a="openai/gpt-x", b="local/tiny-random", c="hosted_vllm/qwen")
    spec = build_protocol(name, ["a", "b", "c"])
    with pytest.raises(LogitPoolError) as err:
        check_pool_supports(spec, pool)
    assert "a (openai/gpt-x)" in str(err.value)
    assert "c (hosted_vllm/qwen)" in str(err.value)
    assert "b (" not in str(err.value)


def test_compiling_for_an_api_pool_fails_before_any_call():
    pool = api_pool(a="openai/a", b="openai/b")
    with pytest.raises(LogitPoolError, match="not 'local/...' models"):
        compile_graph(build_protocol("logit_fusion", ["a", "b"]), pool)


def test_a_pool_given_only_at_run_time_is_checked_before_the_call(arun):
    from colab_graphs.compile import RunContext

    graph = compile_graph(build_protocol("logit_fusion", ["a", "b"]))  # no pool yet: nothing to check
    context = RunContext(ModelClient(None), api_pool(a="local/tiny-random", b="openai/b"))
    with pytest.raises(LogitPoolError, match=r"member\(s\) b \(openai/b\)"):
        arun(graph.ainvoke({"input": "2 + 2?"}, context=context))


def test_other_graphs_pass_the_pool_check():
    check_pool_supports(build_protocol("solo", ["a"]), api_pool(a="openai/a"))


@pytest.mark.integration
def test_single_member_logit_seat_runs_on_an_api_model(arun, scripted_server, pool_for):
    # One member left is plain generation, which any endpoint can serve.
    server = scripted_server({"a": "The answer is 4.", "b": "The answer is 5."})
    spec = restrict(build_protocol("logit_fusion", ["a", "b"]), ["b"])
    outcome = run_one(arun, spec, pool_for(server, ["a", "b"]))
    assert outcome.output == "5"
    assert [r.model for r in server.requests] == ["b"]


# --- the CLI draws them ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "seat"),
    [("logit_fusion", "[fusion: m1, m2, m3]"), ("contrastive_decoding", "[contrastive: m3, m1]")],
)
def test_show_draws_the_logit_protocols(name, seat):
    from typer.testing import CliRunner

    from colab_graphs.cli.app import app

    result = CliRunner().invoke(app, ["show", name, "--format", "mermaid"])
    assert result.exit_code == 0, result.output
    assert seat in result.output
