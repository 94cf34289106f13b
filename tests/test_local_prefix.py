"""Prompt passes that compute a shared prefix once (`colab_graphs.local.prefix`): the same tokens as the plain
left-padded pass on a real model, in a batch's own prompt pass and in the pass of requests that join it."""

from __future__ import annotations

import pytest

from colab_graphs.local.engines import get_engine
from colab_graphs.local.local_engine import GenerationRequest
from colab_graphs.local.prefix import MIN_SHARED, plan_shared_prefixes
from colab_graphs.local.provider import build_request

SYSTEMS = [
    "You are a careful math tutor. Compute step by step and give the final number.",
    "You answer with just the number, nothing else.",
    None,
]
QUESTIONS = ["What is 66 - 44?", "What is 11 * 14?", "What is (4 + 14) * 7?", "What is 9 + 8?"]


def test_prompts_that_share_prefixes_are_grouped_and_keep_a_token_each() -> None:
    head_a, head_b = list(range(100, 120)), list(range(200, 230))
    prompts = [head_a + [1, 2], head_b + [3], head_a + [4, 5, 6], head_b + [7, 8], [9] * 5]
    plan = plan_shared_prefixes(prompts)
    assert plan is not None
    assert sorted(map(tuple, plan.prefixes)) == [tuple(head_a), tuple(head_b)]
    assert plan.group[4] == -1 and plan.suffixes[4] == [9] * 5  # shares nothing: all of it is suffix
    for prompt, group, suffix in zip(prompts, plan.group, plan.suffixes, strict=True):
        assert (plan.prefixes[group] if group >= 0 else []) + suffix == prompt
    # A prompt that is all prefix still passes its last token (the pass needs its logits).
    same = plan_shared_prefixes([head_b, head_b + [1]])
    assert same is not None and same.suffixes == [head_b[-1:], [head_b[-1], 1]]


def test_sharing_that_would_not_pay_is_not_planned(monkeypatch) -> None:
    assert plan_shared_prefixes([[1] * 40, [2] * 40]) is None  # nothing shared
    assert (
        plan_shared_prefixes([list(range(MIN_SHARED - 1)) + [i] * 30 for i in range(4)]) is None
    )  # too short
    assert plan_shared_prefixes([[5] * 40]) is None  # one prompt
    monkeypatch.setenv("COLAB_GRAPHS_SHARED_PREFIX", "0")
    assert plan_shared_prefixes([list(range(30)) + [i] for i in range(4)]) is None


def _requests(engine) -> list[GenerationRequest]:
    """The default audit's shape: three members' system prompts in front of the same questions, greedy and
    sampled (seeded) rows."""
    requests = []
    for system in SYSTEMS:
        for i, question in enumerate(QUESTIONS):
            messages = ([{"role": "system", "content": system}] if system else []) + [
                {
                    "role": "user",
                    "content": question + "\n\nAnswer concisely. End with: The answer is <number>.",
                }
            ]
            sampled = {"temperature": 0.8, "seed": 7 + i} if system is None else {"temperature": 0}
            requests.append(build_request(engine, messages, {**sampled, "max_tokens": 20}))
    return requests


@pytest.fixture(scope="module")
def smollm2():
    return get_engine("smollm2-135m")


def test_a_shared_prefix_pass_gives_the_plain_passs_tokens(smollm2, monkeypatch) -> None:
    requests = _requests(smollm2)
    assert plan_shared_prefixes([r.prompt_ids for r in requests]) is not None  # the shared pass runs
    shared = smollm2.generate_batch(requests)
    monkeypatch.setenv("COLAB_GRAPHS_SHARED_PREFIX", "0")
    plain = smollm2.generate_batch(_requests(smollm2))
    assert [r.completion_ids for r in shared] == [r.completion_ids for r in plain]
    assert any(r.text.strip() for r in shared)
    for s, p in zip(shared, plain, strict=True):
        assert s.logprobs == pytest.approx(p.logprobs, abs=1e-3)


def test_requests_that_join_a_running_batch_share_their_prefix_too(smollm2, monkeypatch) -> None:
    first, *later = _requests(smollm2)
    waiting = [(r, None) for r in later]

    def admit(fits, room):
        joined = [r for r, _ in waiting if fits(r)][:room]
        waiting[:] = [(r, f) for r, f in waiting if all(r is not j for j in joined)]
        return joined

    # Room for the joiners' shared layout: the first row's prompt is the longest (its pass is plain).
    first.prompt_ids = [first.prompt_ids[0]] * 40 + first.prompt_ids
    steps = smollm2.steps
    joined = smollm2.generate_batch([first], admit)
    assert not waiting and len(joined) == 12
    assert smollm2.steps - steps <= 2 + max(
        r.max_tokens for r in _requests(smollm2)
    )  # one pass for all joiners
    monkeypatch.setenv("COLAB_GRAPHS_SHARED_PREFIX", "0")
    alone = smollm2.generate_batch(later)
    assert [r.completion_ids for r in joined[1:]] == [r.completion_ids for r in alone]
