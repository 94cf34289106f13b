"""The in-process ``local/`` provider: batching engine, sampling settings, token ids, logit-level modes."""

from __future__ import annotations

import asyncio
import copy

import pytest

import colab_graphs._env  # noqa: F401
from colab_graphs.local.local_engine import GenerationRequest
from colab_graphs.local.logits import VocabularyMismatchError, contrastive_decoding, logit_fusion
from colab_graphs.local.provider import (
    build_request,
    get_engine,
    local_call_details,
    register_local_provider,
    set_local_model,
)

TINY = "tiny-random"
QUESTION = [{"role": "user", "content": "What is 2+2?"}]


@pytest.fixture(scope="module")
def litellm():
    import litellm as _litellm

    register_local_provider()
    return _litellm


@pytest.fixture(scope="module")
def tiny():
    return get_engine(TINY)


def _prompts(engine, n: int) -> list[list[int]]:
    # Different lengths, so batching really pads.
    return [engine.render([{"role": "user", "content": "hello " * i + "What is 2+2?"}]) for i in range(n)]


def test_tiny_random_generates_through_litellm_acompletion(litellm, arun):
    response = arun(
        litellm.acompletion(model=f"local/{TINY}", messages=QUESTION, max_tokens=8, temperature=0)
    )
    assert response.choices[0].message.role == "assistant"
    assert response.choices[0].message.content
    assert response.choices[0].finish_reason in {"stop", "length"}


def test_sync_litellm_completion_matches_async(litellm, arun):
    kwargs = {"model": f"local/{TINY}", "messages": QUESTION, "max_tokens": 8, "temperature": 0}
    sync = litellm.completion(**kwargs)
    async_ = arun(litellm.acompletion(**kwargs))
    assert sync.choices[0].message.content == async_.choices[0].message.content


def test_response_carries_usage_and_exact_token_ids(litellm, tiny, arun):
    response = arun(
        litellm.acompletion(model=f"local/{TINY}", messages=QUESTION, max_tokens=6, temperature=0)
    )
    details = local_call_details(response)
    assert details["prompt_token_ids"] == tiny.render(QUESTION)
    assert len(details["completion_token_ids"]) == len(details["logprobs"]) == 6
    assert tiny.tokenizer.decode(details["completion_token_ids"]) == response.choices[0].message.content
    assert response.usage.prompt_tokens == len(details["prompt_token_ids"])
    assert response.usage.completion_tokens == 6
    assert all(lp <= 0 for lp in details["logprobs"])


def test_a_local_members_call_costs_nothing_not_an_unknown_price(arun):
    # (An audit of the embedded default used to report "Cost: unknown" while its plan priced it at $0.)
    from colab_graphs.models.client import ModelClient
    from colab_graphs.pool import Member

    member = Member(name="t", settings={"model": f"local/{TINY}", "max_tokens": 4, "temperature": 0})
    call = arun(ModelClient(None).complete(member, QUESTION))
    assert call.cost_usd == 0.0 and call.usage.completion_tokens == 4


def test_token_details_survive_model_dump_and_rebuild(litellm, arun):
    from litellm import ModelResponse

    response = arun(
        litellm.acompletion(model=f"local/{TINY}", messages=QUESTION, max_tokens=4, temperature=0)
    )
    dumped = response.model_dump()
    assert local_call_details(dumped) == local_call_details(response)
    assert local_call_details(ModelResponse(**dumped)) == local_call_details(response)


def test_openai_logprobs_returned_when_asked(litellm, arun):
    response = arun(
        litellm.acompletion(
            model=f"local/{TINY}",
            messages=QUESTION,
            max_tokens=5,
            temperature=0,
            logprobs=True,
            top_logprobs=3,
        )
    )
    content = response.choices[0].logprobs.content
    details = local_call_details(response)
    assert [c.logprob for c in content] == details["logprobs"]
    assert all(len(c.top_logprobs) == 3 for c in content)
    # Greedy: the chosen token is the most likely one.
    assert all(c.top_logprobs[0].logprob == c.logprob for c in content)


def test_non_local_response_has_no_details():
    assert local_call_details({"choices": [{"message": {"content": "x"}}]}) is None


def test_batched_greedy_equals_batch_of_one(tiny):
    requests = [GenerationRequest(p, max_tokens=16, temperature=0) for p in _prompts(tiny, 5)]
    singles = [tiny.generate_batch([r])[0] for r in requests]
    batched = tiny.generate_batch(requests)
    assert [b.completion_ids for b in batched] == [s.completion_ids for s in singles]
    for b, s in zip(batched, singles, strict=True):
        assert b.logprobs == pytest.approx(s.logprobs, abs=1e-4)


def test_concurrent_requests_are_batched_and_match_sequential(litellm, tiny, arun):
    messages = [[{"role": "user", "content": f"Count to {i}"}] for i in range(6)]
    sequential = [
        tiny.generate_batch([build_request(tiny, m, {"temperature": 0, "max_tokens": 10})])[0]
        for m in messages
    ]
    before = tiny.batches_run

    async def all_at_once():
        return await asyncio.gather(
            *[
                litellm.acompletion(model=f"local/{TINY}", messages=m, temperature=0, max_tokens=10)
                for m in messages
            ]
        )

    responses = arun(all_at_once())
    assert tiny.batches_run - before < len(messages)
    assert [local_call_details(r)["completion_token_ids"] for r in responses] == [
        s.completion_ids for s in sequential
    ]


def test_seeded_sampling_repeats_and_ignores_batch_neighbours(tiny):
    prompt = _prompts(tiny, 1)[0]
    alone = tiny.generate_batch([GenerationRequest(prompt, max_tokens=12, temperature=1.0, seed=7)])[0]
    neighbours = [GenerationRequest(p, max_tokens=12, temperature=1.0, seed=99) for p in _prompts(tiny, 3)]
    together = tiny.generate_batch(
        [*neighbours, GenerationRequest(prompt, max_tokens=12, temperature=1.0, seed=7)]
    )
    assert together[-1].completion_ids == alone.completion_ids


def test_a_negative_seed_does_not_draw_as_its_absolute_value(tiny):
    """Python's random.Random(-5) repeats random.Random(5): a signed 64-bit seed must not."""
    prompt = _prompts(tiny, 1)[0]
    draws = [
        tiny.generate_batch([GenerationRequest(prompt, max_tokens=12, temperature=1.0, seed=s)])[
            0
        ].completion_ids
        for s in (5, -5)
    ]
    assert draws[0] != draws[1]


def test_different_seeds_give_different_samples(tiny):
    prompt = _prompts(tiny, 1)[0]
    runs = {
        tuple(
            tiny.generate_batch([GenerationRequest(prompt, max_tokens=12, temperature=1.0, seed=s)])[
                0
            ].completion_ids
        )
        for s in range(4)
    }
    assert len(runs) > 1


def test_tiny_top_p_keeps_only_the_most_likely_token(tiny):
    prompt = _prompts(tiny, 1)[0]
    greedy = tiny.generate_batch([GenerationRequest(prompt, max_tokens=10, temperature=0)])[0]
    nucleus = tiny.generate_batch(
        [GenerationRequest(prompt, max_tokens=10, temperature=1.5, top_p=1e-6, seed=1)]
    )[0]
    assert nucleus.completion_ids == greedy.completion_ids


def _rows(tiny, n: int = 2, **settings):
    from colab_graphs.local.local_engine import _Row

    return [_Row(GenerationRequest([1], **settings), tiny) for _ in range(n)]


LOGITS = [[0.7, 0.2, 0.1], [0.1, 0.1, 0.8]]


def _frequencies(tiny, draws: int = 4000, **settings):
    """How often each token is drawn, per row, over `draws` batched draws of two rows with LOGITS."""
    import torch

    from colab_graphs.local.local_engine import draw_tokens

    logits = torch.log(torch.tensor(LOGITS))
    rows = _rows(tiny, **settings)
    tokens = torch.tensor([draw_tokens(rows, logits)[0] for _ in range(draws)])
    return [torch.bincount(tokens[:, r], minlength=3).float() / draws for r in range(2)]


def test_each_row_of_a_batched_draw_samples_its_own_distribution(tiny):
    import torch

    for row, expected in zip(_frequencies(tiny, temperature=1.0), LOGITS, strict=True):
        assert torch.allclose(row, torch.tensor(expected), atol=0.03), row


def test_top_p_top_k_and_min_p_cut_each_row_before_it_samples(tiny):
    nucleus = _frequencies(tiny, 300, temperature=1.0, top_p=0.75)
    assert nucleus[0][2] == 0 and nucleus[1].tolist() == [0, 0, 1]  # row-wise nuclei: {0, 1} and {2}
    top_one = _frequencies(tiny, 300, temperature=1.0, top_k=1)
    assert [r.tolist() for r in top_one] == [[1, 0, 0], [0, 0, 1]]
    floor = _frequencies(tiny, 300, temperature=1.0, min_p=0.2)  # drops p < 0.2 x the top token's
    assert floor[0][2] == 0 and floor[1].tolist() == [0, 0, 1]


def test_greedy_rows_take_the_argmax(tiny):
    import torch

    from colab_graphs.local.local_engine import draw_tokens

    logits = torch.log(torch.tensor(LOGITS))
    assert draw_tokens(_rows(tiny, temperature=0), logits)[0] == [0, 2]


def test_repetition_penalty_lowers_tokens_already_seen(tiny):
    import torch

    from colab_graphs.local.local_engine import _Row, draw_tokens

    logits = torch.log(torch.tensor([[0.5, 0.45, 0.05]]))
    seen = _Row(
        GenerationRequest([0], temperature=0, repetition_penalty=2.0), tiny
    )  # token 0 is in the prompt
    assert draw_tokens([seen], logits)[0] == [1]


def test_processed_logprobs_are_those_of_the_distribution_sampled_from(tiny):
    """At temperature 0.5 with top-p, a token's processed logprob is its log-probability after tempering,
    cutting and renormalising; the raw logprob stays the model's own."""
    import math

    import torch

    from colab_graphs.local.local_engine import _Row, draw_tokens

    logits = torch.log(torch.tensor([[0.5, 0.3, 0.2]]))
    tempered = torch.softmax(logits[0] / 0.5, dim=-1)  # [0.658, 0.237, 0.105]
    kept = tempered[:2] / tempered[:2].sum()  # top_p 0.8 keeps tokens 0 and 1
    for mode, expected in (("processed", kept.log()), ("raw", torch.log(torch.tensor([0.5, 0.3])))):
        for seed in range(20):
            row = _Row(
                GenerationRequest([1], temperature=0.5, top_p=0.8, seed=seed, logprobs_mode=mode), tiny
            )
            (token,), (logprob,), _ = draw_tokens([row], logits)
            assert token in (0, 1)
            assert logprob == pytest.approx(float(expected[token]), abs=1e-5), (mode, token)
    assert math.isclose(float(kept.sum()), 1.0, abs_tol=1e-6)


def test_out_of_range_sampling_settings_name_every_problem(tiny):
    request = GenerationRequest([1], top_p=0.0, top_k=-1, min_p=2.0, repetition_penalty=0.0)
    with pytest.raises(ValueError, match=r"top_p .*; top_k .*; min_p .*; repetition_penalty"):
        tiny.generate_batch([request])


def test_request_settings_reach_the_engine(tiny):
    request = build_request(
        tiny, QUESTION, {"top_k": 5, "min_p": 0.1, "repetition_penalty": 1.3, "seed": 4, "temperature": 0.7}
    )
    assert (request.top_k, request.min_p, request.repetition_penalty, request.seed) == (5, 0.1, 1.3, 4)


def test_a_batched_draw_records_each_tokens_logprob(tiny):
    import torch

    prompts = _prompts(tiny, 3)
    results = tiny.generate_batch([GenerationRequest(p, max_tokens=6, temperature=1.0) for p in prompts])
    for prompt, result in zip(prompts, results, strict=True):
        ids = torch.tensor([prompt + result.completion_ids])
        with torch.no_grad():
            logp = torch.log_softmax(tiny.model(ids).logits[0].float(), dim=-1)
        expected = [float(logp[len(prompt) - 1 + i, t]) for i, t in enumerate(result.completion_ids)]
        assert result.logprobs == pytest.approx(expected, abs=1e-4)


def test_stop_string_cuts_text_and_ends_generation(tiny):
    prompt = _prompts(tiny, 1)[0]
    full = tiny.generate_batch([GenerationRequest(prompt, max_tokens=16, temperature=0)])[0]
    stop = full.text[len(full.text) // 2 :][:2]
    cut = tiny.generate_batch([GenerationRequest(prompt, max_tokens=16, temperature=0, stop=[stop])])[0]
    assert cut.text == full.text[: full.text.find(stop)]
    assert cut.finish_reason == "stop"
    assert len(cut.completion_ids) < len(full.completion_ids)
    assert cut.completion_ids == full.completion_ids[: len(cut.completion_ids)]


def test_max_tokens_ends_with_finish_reason_length(tiny):
    result = tiny.generate_batch([GenerationRequest(_prompts(tiny, 1)[0], max_tokens=3, temperature=0)])[0]
    assert len(result.completion_ids) == 3
    assert result.finish_reason == "length"


def test_streaming_callback_sees_the_whole_text(tiny):
    pieces: list[str] = []
    request = GenerationRequest(_prompts(tiny, 1)[0], max_tokens=12, temperature=0, on_text=pieces.append)
    result = tiny.generate(request)
    assert len(pieces) > 1
    assert "".join(pieces) == result.text


def test_text_without_stop_strings_is_the_decoded_completion(tiny):
    requests = [GenerationRequest(p, max_tokens=7, temperature=1.0, seed=3) for p in _prompts(tiny, 3)]
    for result in tiny.generate_batch(requests):
        assert result.text == tiny.tokenizer.decode(result.completion_ids, skip_special_tokens=True)


def test_rendering_follows_a_swapped_tokenizer(tiny):
    engine = set_local_model("tiny-render-swap", tiny.model, tiny.tokenizer)
    with_template = engine.render(QUESTION)
    assert engine.render(QUESTION) == with_template  # remembered, same ids
    plain = copy.deepcopy(tiny.tokenizer)
    plain.chat_template = None
    set_local_model("tiny-render-swap", tiny.model, plain)
    assert plain.decode(engine.render(QUESTION)) == "User: What is 2+2?\nAssistant:"


def test_expected_callers_join_one_batch(tiny):
    import time

    prompts = _prompts(tiny, 2)
    engine = set_local_model("tiny-expecting", tiny.model, tiny.tokenizer)
    before = engine.batches_run
    with engine.expecting(1):  # one caller announced it may still send a request
        first = engine.submit(GenerationRequest(prompts[0], max_tokens=2, temperature=0))
        time.sleep(0.03)  # far past batch_wait_ms: without the hint the first request runs alone
        with engine.expecting(-1):
            second = engine.submit(GenerationRequest(prompts[1], max_tokens=2, temperature=0))
            first.result(), second.result()
    assert engine.batches_run - before == 1


def test_failed_request_raises_to_its_caller(tiny):
    with pytest.raises(ValueError, match="at least one prompt token"):
        tiny.generate(GenerationRequest([], max_tokens=3))


def test_sampling_settings_of_the_wrong_type_or_range_are_refused_naming_each(tiny):
    with pytest.raises(ValueError) as caught:
        build_request(tiny, QUESTION, {"temperature": "hot", "max_tokens": "lots", "top_p": 0, "seed": 2**64})
    message = str(caught.value)
    assert all(field in message for field in ("temperature", "max_tokens", "top_p", "seed"))


def test_a_temperature_too_small_to_divide_by_decodes_greedily(tiny):
    greedy = tiny.generate(build_request(tiny, QUESTION, {"temperature": 0, "max_tokens": 6}))
    assert (
        tiny.generate(build_request(tiny, QUESTION, {"temperature": 1e-30, "max_tokens": 6})).text
        == greedy.text
    )


def test_set_local_model_serves_and_swaps_weights(litellm, tiny, arun):
    import torch

    model = copy.deepcopy(tiny.model)
    set_local_model("policy-under-training", model, tiny.tokenizer)
    kwargs = {"model": "local/policy-under-training", "messages": QUESTION, "max_tokens": 8, "temperature": 0}
    before = local_call_details(arun(litellm.acompletion(**kwargs)))["completion_token_ids"]
    assert (
        before
        == tiny.generate(build_request(tiny, QUESTION, {"temperature": 0, "max_tokens": 8})).completion_ids
    )
    with torch.no_grad():
        model.lm_head.weight.mul_(-1.0)  # an in-place update, as a trainer step does
    after = local_call_details(arun(litellm.acompletion(**kwargs)))["completion_token_ids"]
    assert after != before
    assert get_engine("local/policy-under-training").model is model


def test_model_without_chat_template_gets_the_fallback_prompt(tiny):
    tokenizer = copy.deepcopy(tiny.tokenizer)
    tokenizer.chat_template = None
    engine = set_local_model("tiny-base", tiny.model, tokenizer)
    text = tokenizer.decode(engine.render([{"role": "system", "content": "Be brief."}, *QUESTION]))
    assert text == "Be brief.\n\nUser: What is 2+2?\nAssistant:"


def test_logit_fusion_of_a_model_with_itself_equals_its_greedy_output(tiny):
    greedy = tiny.generate(build_request(tiny, QUESTION, {"temperature": 0, "max_tokens": 12}))
    fused = logit_fusion([TINY, TINY], QUESTION, max_tokens=12, temperature=0)
    assert fused.completion_ids == greedy.completion_ids


def test_logit_fusion_with_zero_weight_follows_the_other_member(tiny):
    other = copy.deepcopy(tiny.model)
    with __import__("torch").no_grad():
        other.lm_head.weight.mul_(-1.0)
    set_local_model("tiny-flipped", other, tiny.tokenizer)
    greedy = tiny.generate(build_request(tiny, QUESTION, {"temperature": 0, "max_tokens": 10}))
    fused = logit_fusion([TINY, "tiny-flipped"], QUESTION, weights=[1.0, 0.0], max_tokens=10, temperature=0)
    assert fused.completion_ids == greedy.completion_ids
    mixed = logit_fusion([TINY, "tiny-flipped"], QUESTION, weights=[0.5, 0.5], max_tokens=10, temperature=0)
    assert mixed.completion_ids != greedy.completion_ids


def test_contrastive_with_beta_zero_is_the_strong_models_greedy_output(tiny):
    set_local_model("tiny-weak", copy.deepcopy(tiny.model), tiny.tokenizer)
    greedy = tiny.generate(build_request(tiny, QUESTION, {"temperature": 0, "max_tokens": 10}))
    result = contrastive_decoding(TINY, "tiny-weak", QUESTION, beta=0.0, max_tokens=10, temperature=0)
    assert result.completion_ids == greedy.completion_ids


def test_contrastive_with_mismatched_vocabularies_names_both_models(tiny):
    tokenizer = copy.deepcopy(tiny.tokenizer)
    tokenizer.add_tokens(["<extra-token>"])
    set_local_model("tiny-other-vocab", tiny.model, tokenizer)
    with pytest.raises(VocabularyMismatchError, match="'tiny-random'.*'tiny-other-vocab'"):
        contrastive_decoding(TINY, "tiny-other-vocab", QUESTION, max_tokens=4)


def test_logit_mode_reaches_the_provider_as_a_keyword(litellm, arun):
    direct = logit_fusion([TINY, TINY], QUESTION, max_tokens=8, temperature=0)
    response = arun(
        litellm.acompletion(
            model=f"local/{TINY}",
            messages=QUESTION,
            max_tokens=8,
            temperature=0,
            colab_graphs={"logit_mode": "fusion", "members": [TINY, TINY]},
        )
    )
    assert local_call_details(response)["completion_token_ids"] == direct.completion_ids


def test_logit_mode_reaches_the_provider_through_metadata(litellm, tiny, arun):
    set_local_model("tiny-weak", copy.deepcopy(tiny.model), tiny.tokenizer)
    direct = contrastive_decoding(
        TINY, "tiny-weak", QUESTION, alpha=0.2, beta=0.5, max_tokens=8, temperature=0
    )
    settings = {"logit_mode": "contrastive", "members": [TINY, "tiny-weak"], "alpha": 0.2, "beta": 0.5}
    response = arun(
        litellm.acompletion(
            model=f"local/{TINY}",
            messages=QUESTION,
            max_tokens=8,
            temperature=0,
            metadata={"colab_graphs": settings},
        )
    )
    assert local_call_details(response)["completion_token_ids"] == direct.completion_ids


def test_unknown_logit_mode_is_a_clear_error(litellm, arun):
    with pytest.raises(Exception, match="logit_mode must be 'fusion', 'contrastive'"):
        arun(
            litellm.acompletion(
                model=f"local/{TINY}",
                messages=QUESTION,
                max_tokens=4,
                colab_graphs={"logit_mode": "vote", "members": [TINY]},
            )
        )


@pytest.mark.slow
def test_smollm2_answers_with_real_text(litellm, arun):
    response = arun(
        litellm.acompletion(model="local/smollm2-135m", messages=QUESTION, max_tokens=30, temperature=0)
    )
    text = response.choices[0].message.content
    assert any(ch.isdigit() for ch in text)
    assert len(text.split()) >= 3
    assert response.choices[0].finish_reason == "stop"


@pytest.mark.slow
def test_smollm2_batched_greedy_equals_batch_of_one():
    engine = get_engine("smollm2-135m")
    questions = [
        "What is 2+2?",
        "Name a colour.",
        "Say hello in French, please.",
        "What is the capital of Italy?",
    ]
    requests = [
        build_request(engine, [{"role": "user", "content": q}], {"temperature": 0, "max_tokens": 24})
        for q in questions
    ]
    singles = [engine.generate_batch([r])[0] for r in requests]
    batched = engine.generate_batch(requests)
    assert [b.completion_ids for b in batched] == [s.completion_ids for s in singles]


def test_unload_stops_the_worker_and_a_later_call_loads_again(tiny):
    from colab_graphs.local.provider import unload

    engine = set_local_model("tiny-temporary", tiny.model, tiny.tokenizer)
    engine.generate(GenerationRequest(_prompts(tiny, 1)[0], max_tokens=2, temperature=0))
    worker = engine._worker
    unload("tiny-temporary")
    worker.join(timeout=10)
    assert not worker.is_alive()
    with pytest.raises(FileNotFoundError, match="tiny-temporary"):
        get_engine("tiny-temporary")


def test_engine_decodes_the_tokens_transformers_generate_decodes(tiny):
    import torch

    prompt = _prompts(tiny, 3)[2]
    ours = tiny.generate_batch([GenerationRequest(prompt, max_tokens=12, temperature=0)])[0]
    with torch.inference_mode():
        out = tiny.model.generate(
            input_ids=torch.tensor([prompt]),
            max_new_tokens=len(ours.completion_ids),
            do_sample=False,
            output_logits=True,
            return_dict_in_generate=True,
            pad_token_id=tiny.pad_id,
            eos_token_id=sorted(tiny.eos_ids),
        )
    assert out.sequences[0, len(prompt) :].tolist() == ours.completion_ids
    theirs = [
        float(torch.log_softmax(step[0].float(), -1)[t])
        for step, t in zip(out.logits, ours.completion_ids, strict=True)
    ]
    assert ours.logprobs == pytest.approx(theirs, abs=1e-5)


def test_preallocated_cache_holds_what_a_growing_cache_holds(tiny):
    import torch
    from transformers.cache_utils import DynamicCache

    from colab_graphs.local.local_engine import preallocated_cache

    model = tiny.model
    ids = torch.tensor([_prompts(tiny, 2)[1], _prompts(tiny, 2)[1][::-1]])
    grown, fixed = DynamicCache(config=model.config), preallocated_cache(model, ids.shape[1] + 4)
    with torch.inference_mode():
        for cache in (grown, fixed):
            model(input_ids=ids, cache=cache, use_cache=True)
            cache.batch_select_indices(torch.tensor([1]))
        a = model(input_ids=torch.tensor([[5]]), cache=grown, use_cache=True).logits
        b = model(input_ids=torch.tensor([[5]]), cache=fixed, use_cache=True).logits
    assert torch.equal(a, b)
    for x, y in zip(grown.layers, fixed.layers, strict=True):
        assert torch.equal(x.keys, y.keys) and torch.equal(x.values, y.values)
    assert fixed.get_seq_length() == grown.get_seq_length() == ids.shape[1] + 1


def test_bfloat16_member_repeats_its_greedy_answer(tiny):
    import torch

    half = get_engine(TINY, dtype="bfloat16")
    assert half is not tiny and half.model.dtype == torch.bfloat16
    request = GenerationRequest(_prompts(tiny, 1)[0], max_tokens=12, temperature=0)
    first, again = half.generate_batch([request])[0], half.generate_batch([request])[0]
    assert first.completion_ids == again.completion_ids and first.logprobs == again.logprobs


def test_dtype_reaches_the_provider_through_metadata(litellm, arun):
    half = get_engine(TINY, dtype="bfloat16")
    before = half.batches_run
    arun(
        litellm.acompletion(
            model=f"local/{TINY}",
            messages=QUESTION,
            max_tokens=4,
            temperature=0,
            metadata={"colab_graphs": {"dtype": "bfloat16"}},
        )
    )
    assert half.batches_run == before + 1


def test_models_load_in_float32_unless_asked(tiny):
    import torch

    assert tiny.model.dtype == torch.float32


def test_a_policy_set_by_its_trainer_is_served_as_handed_over(tiny):
    import torch

    policy = set_local_model("policy-in-float32", copy.deepcopy(tiny.model), tiny.tokenizer)
    assert get_engine("policy-in-float32", dtype="bfloat16") is policy
    assert policy.model.dtype == torch.float32


def test_unknown_dtype_is_a_clear_error():
    with pytest.raises(ValueError, match="float32, bfloat16, float16"):
        get_engine(TINY, dtype="int4")


def test_logit_modes_refuse_another_dtype(litellm, arun):
    with pytest.raises(Exception, match="logit-level modes decode in float32"):
        arun(
            litellm.acompletion(
                model=f"local/{TINY}",
                messages=QUESTION,
                max_tokens=4,
                colab_graphs={"logit_mode": "fusion", "members": [TINY, TINY], "dtype": "bfloat16"},
            )
        )


def test_decoding_threads_follow_the_variable_not_the_load_average(tiny, monkeypatch):
    """Unset: torch's own count, whatever the load average says (a lagging average once halved a quiet
    machine); set: that count for the batch, restored after; the tokens are the same either way."""
    import os

    import torch

    from colab_graphs.local import local_engine

    ceiling = torch.get_num_threads()
    monkeypatch.delenv(local_engine.THREADS_ENV, raising=False)
    monkeypatch.setattr(os, "getloadavg", lambda: (99.0, 99.0, 99.0))
    with local_engine.decoding_threads() as threads:
        assert threads == ceiling == torch.get_num_threads()
    request = GenerationRequest(_prompts(tiny, 1)[0], max_tokens=8, temperature=0)
    default = tiny.generate_batch([request])[0]
    monkeypatch.setenv(local_engine.THREADS_ENV, "1")
    with local_engine.decoding_threads() as threads:
        assert threads == 1 == torch.get_num_threads()
    assert torch.get_num_threads() == ceiling
    assert tiny.generate_batch([request])[0].completion_ids == default.completion_ids


@pytest.mark.slow
def test_passive_waits_by_default_and_the_users_value_wins():
    """torch's spinning waits crawl beside busy processes (BENCHMARKS.md: 8x at a load of 7); the engine sets
    PASSIVE before torch loads unless the user chose."""
    import os
    import subprocess
    import sys

    code = "import colab_graphs.local.provider, os, torch; print(os.environ['OMP_WAIT_POLICY'])"
    env = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}
    unset = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    chosen = subprocess.run(
        [sys.executable, "-c", code], env={**env, "OMP_WAIT_POLICY": "ACTIVE"}, capture_output=True, text=True
    )
    assert (unset.stdout.strip(), chosen.stdout.strip()) == ("PASSIVE", "ACTIVE")
