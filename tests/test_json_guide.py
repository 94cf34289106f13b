"""Guided JSON decoding: which texts a schema accepts as they are written, and real models held to it."""

from __future__ import annotations

import json

import pytest

import colab_graphs._env  # noqa: F401
from colab_graphs.local.json_guide import JsonGuide, JsonMatcher, schema_problems, vocabulary
from colab_graphs.local.local_engine import GenerationRequest
from colab_graphs.local.provider import get_engine

CALL = {
    "type": "object",
    "properties": {
        "name": {"const": "calc"},
        "arguments": {
            "type": "object",
            "properties": {"expression": {"type": "string", "maxLength": 12}},
            "required": ["expression"],
        },
    },
    "required": ["name", "arguments"],
}
PERSON = {
    "$defs": {
        "Pet": {"type": "object", "properties": {"kind": {"enum": ["cat", "dog"]}}, "required": ["kind"]}
    },
    "type": "object",
    "properties": {
        "name": {"type": "string", "minLength": 1, "maxLength": 8},
        "age": {"type": "integer", "minimum": 0, "maximum": 150},
        "tags": {"type": "array", "items": {"type": "boolean"}, "maxItems": 2},
        "pet": {"anyOf": [{"$ref": "#/$defs/Pet"}, {"type": "null"}]},
    },
    "required": ["name", "age"],
}


def valid(schema: dict, text: str) -> bool:
    return JsonMatcher(schema).progress(text).valid


def test_every_beginning_of_an_accepted_value_is_valid_and_the_whole_is_complete():
    text = '{"name": "calc", "arguments": {"expression": "12 * 7"}}'
    matcher = JsonMatcher(CALL)
    assert all(matcher.progress(text[:k]).valid for k in range(len(text) + 1))
    assert matcher.progress(text).complete and not matcher.progress(text).open


def test_keys_may_come_in_any_order_but_each_once():
    assert valid(CALL, '{"arguments": {"expression": "1"}, "name": "calc"}')
    assert not valid(CALL, '{"name": "calc", "name"')


@pytest.mark.parametrize(
    "text",
    [
        '{"name": "calc"}',  # a required key is missing
        '{"name": "calc",}',  # a comma with nothing after it
        '{"name": "cal"}',  # not the const
        '{"name": "calc", "extra": 1',  # a key the schema does not list
        '{"arguments": {"expression": "a\nb"',  # a raw newline inside a string
        '{"arguments": {"expression": "0123456789abc"',  # past maxLength
        ' {"name"',  # whitespace before the value
        '{"name":  "calc"',  # padding: only json.dumps's one space
        '{"name": "calc"} ',  # anything after the value
    ],
)
def test_texts_written_to_slip_past_the_schema_are_refused(text):
    assert not valid(CALL, text)


def test_a_comma_is_refused_when_no_key_is_left_to_write():
    one_key = {"type": "object", "properties": {"a": {"type": "integer"}}}
    assert valid(one_key, '{"a": 1')
    assert not valid(one_key, '{"a": 1,')


def test_numbers_follow_json_grammar_and_bounds_apply_when_they_end():
    age = {"type": "integer", "minimum": 0, "maximum": 150}
    assert JsonMatcher(age).progress("42").complete
    assert valid(age, "15")  # 150 is still ahead
    assert not valid(age, "151") and not valid(age, "420")  # no number written this way is in range
    assert not valid(age, "-")
    assert not valid(age, "01")
    assert not valid(age, "4.5")
    assert valid({"type": "number"}, "-4.5e")
    assert not valid({"type": "number"}, "1" * 30)  # a model cannot pad a number forever


def test_references_unions_arrays_and_enums_are_followed():
    assert (
        JsonMatcher(PERSON)
        .progress('{"name": "Ada", "age": 36, "tags": [true, false], "pet": {"kind": "cat"}}')
        .complete
    )
    assert JsonMatcher(PERSON).progress('{"name": "Ada", "age": 36, "pet": null}').complete
    assert not valid(PERSON, '{"name": "Ada", "age": 36, "pet": {"kind": "cow"')
    assert not valid(PERSON, '{"name": "Ada", "age": 36, "tags": [true, false, ')
    assert not valid(PERSON, '{"name": "", ')  # minLength 1


def test_keywords_guided_decoding_cannot_enforce_are_named():
    problems = schema_problems({"type": "object", "properties": {"a": {"type": "string", "pattern": "^x"}}})
    assert problems == ["schema.properties.a: 'pattern' cannot be enforced while decoding"]
    assert schema_problems(PERSON) == [] and schema_problems(CALL) == []
    assert "only local references" in schema_problems({"$ref": "https://example.com/s.json"})[0]


def guided(model: str, schema: dict, temperature: float = 0.0, max_tokens: int = 80, seed: int = 0) -> str:
    engine = get_engine(model)
    prompt = engine.render([{"role": "user", "content": "Write the JSON."}])
    request = GenerationRequest(prompt, max_tokens=max_tokens, temperature=temperature, seed=seed)
    request.allowed_tokens = JsonGuide(schema, vocabulary(engine.tokenizer), engine.eos_ids, temperature <= 0)
    result = engine.generate(request)
    assert result.finish_reason == "stop", result.text
    return result.text


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_a_random_model_is_held_to_the_schema_whatever_it_prefers(seed):
    # tiny-random wants byte soup; every reply must still parse and match the schema
    schema = {
        "type": "object",
        "properties": {
            "ok": {"type": "boolean"},
            "kind": {"enum": ["a", "b"]},
            "n": {"type": "integer", "minimum": 0, "maximum": 9},
            "note": {"type": "string", "maxLength": 6},
        },
        "required": ["ok", "kind", "n", "note"],
    }
    reply = json.loads(guided("tiny-random", schema, temperature=1.0, seed=seed))
    assert set(reply) == {"ok", "kind", "n", "note"}
    assert isinstance(reply["ok"], bool) and reply["kind"] in ("a", "b") and 0 <= reply["n"] <= 9
    assert isinstance(reply["note"], str) and len(reply["note"]) <= 6


def test_a_forced_call_is_written_with_the_tokens_the_tokenizer_would_use():
    engine = get_engine("tiny-random")
    text = guided("tiny-random", CALL)
    call = json.loads(text)
    assert call["name"] == "calc" and isinstance(call["arguments"]["expression"], str)
    assert text.startswith('{"name": "calc", "arguments": {"expression": "') or text.startswith(
        '{"arguments"'
    )
    assert engine.tokenizer.decode(engine.tokenizer.encode(text, add_special_tokens=False)) == text
