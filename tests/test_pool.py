"""The model pool: YAML loading, environment expansion, and errors that name the file and the member."""

from __future__ import annotations

from pathlib import Path

import pytest

from colab_graphs.pool import Member, Pool, PoolError


def write_pool(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "pool.yaml"
    path.write_text(text)
    return path


def test_yaml_members_keep_file_order(tmp_path: Path) -> None:
    path = write_pool(
        tmp_path,
        "models:\n"
        "  zed: {model: openai/zed}\n"
        "  alice: {model: openai/alice, temperature: 0.2}\n"
        "  bob: {model: openai/bob}\n",
    )
    pool = Pool.from_yaml(path)
    assert pool.names == ["zed", "alice", "bob"]
    assert pool["alice"].settings == {"model": "openai/alice", "temperature": 0.2}
    assert pool.source == str(path)


def test_env_references_are_expanded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CG_TEST_KEY", "sk-from-env-123")
    monkeypatch.setenv("CG_TEST_PORT", "8123")
    path = write_pool(
        tmp_path,
        "models:\n"
        "  alice:\n"
        "    model: openai/alice\n"
        "    api_key: ${CG_TEST_KEY}\n"
        "    api_base: http://127.0.0.1:${CG_TEST_PORT}/v1\n"
        "    extra_headers: {X-Key: '${CG_TEST_KEY}'}\n",
    )
    alice = Pool.from_yaml(path)["alice"]
    assert alice.settings["api_key"] == "sk-from-env-123"
    assert alice.settings["api_base"] == "http://127.0.0.1:8123/v1"
    assert alice.settings["extra_headers"] == {"X-Key": "sk-from-env-123"}


def test_missing_env_var_names_file_member_and_variable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("CG_TEST_UNSET", raising=False)
    path = write_pool(tmp_path, "models:\n  alice: {model: openai/alice, api_key: '${CG_TEST_UNSET}'}\n")
    with pytest.raises(PoolError) as err:
        Pool.from_yaml(path)
    message = str(err.value)
    assert str(path) in message and "'alice'" in message and "CG_TEST_UNSET" in message


def test_unknown_key_names_file_member_and_key(tmp_path: Path) -> None:
    path = write_pool(
        tmp_path, "models:\n  alice: {model: openai/alice}\n  bob: {model: openai/bob, temprature: 1}\n"
    )
    with pytest.raises(PoolError) as err:
        Pool.from_yaml(path)
    message = str(err.value)
    assert str(path) in message and "'bob'" in message and "temprature" in message
    assert "'alice'" not in message


def test_missing_model_names_file_and_member(tmp_path: Path) -> None:
    path = write_pool(tmp_path, "models:\n  alice: {temperature: 0.5}\n")
    with pytest.raises(PoolError, match=r"pool\.yaml: member 'alice' has no 'model'") as err:
        Pool.from_yaml(path)
    assert str(path) in str(err.value)


def test_duplicate_member_in_yaml_is_an_error_not_a_silent_override(tmp_path: Path) -> None:
    path = write_pool(tmp_path, "models:\n  alice: {model: openai/a1}\n  alice: {model: openai/a2}\n")
    with pytest.raises(PoolError, match="alice") as err:
        Pool.from_yaml(path)
    assert str(path) in str(err.value) and "line 3" in str(err.value)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("- alice\n", "top-level 'models:' mapping"),
        ("models:\n  alice: {model: openai/a}\nmembers: {}\n", "unknown top-level key(s) members"),
        ("models: [\n", "not valid YAML"),
        ("models:\n  alice: openai/a\n", "must map to a mapping"),
    ],
)
def test_malformed_pool_files_are_named(tmp_path: Path, text: str, expected: str) -> None:
    path = write_pool(tmp_path, text)
    with pytest.raises(PoolError) as err:
        Pool.from_yaml(path)
    assert str(path) in str(err.value) and expected in str(err.value)


def test_missing_pool_file_is_a_pool_error(tmp_path: Path) -> None:
    with pytest.raises(PoolError, match="does not exist"):
        Pool.from_yaml(tmp_path / "nope.yaml")


def test_description_and_persona_are_member_fields_not_litellm_settings() -> None:
    pool = Pool.from_dict(
        {"a": {"model": "openai/a", "description": "careful", "system_prompt": "Be careful.", "seed": 3}}
    )
    member = pool["a"]
    assert member.description == "careful" and member.system_prompt == "Be careful."
    assert member.settings == {"model": "openai/a", "seed": 3}


def test_connection_settings_and_secrets_are_kept_apart() -> None:
    member = Member(
        name="a",
        settings={"model": "openai/a", "api_base": "http://h/v1", "api_key": "sk-x", "temperature": 0.3},
    )
    assert member.generation_settings() == {"model": "openai/a", "temperature": 0.3}
    assert "api_key" not in member.public_settings() and member.public_settings()["api_base"] == "http://h/v1"
    assert member.endpoint == "http://h/v1"
    assert Member(name="b", settings={"model": "anthropic/claude"}).endpoint == "anthropic"


def test_public_dict_has_no_secrets() -> None:
    pool = Pool.from_dict({"a": {"model": "openai/a", "api_key": "sk-SECRET-1234567", "description": "d"}})
    assert pool.to_public_dict() == {"a": {"model": "openai/a", "description": "d"}}


def test_python_pool_rejects_duplicates_and_emptiness() -> None:
    a = Member(name="a", settings={"model": "openai/a"})
    with pytest.raises(PoolError, match="duplicate member name"):
        Pool([a, a])
    with pytest.raises(PoolError, match="at least one member"):
        Pool([])


def test_unknown_member_lookup_lists_the_members() -> None:
    pool = Pool.from_dict({"a": {"model": "openai/a"}, "b": {"model": "openai/b"}})
    with pytest.raises(KeyError, match="members: a, b"):
        pool["c"]


def test_subset_keeps_pool_order() -> None:
    pool = Pool.from_dict({n: {"model": f"openai/{n}"} for n in ["a", "b", "c"]})
    assert pool.subset(["c", "a"]).names == ["a", "c"]


def test_bad_member_name_is_rejected() -> None:
    with pytest.raises(PoolError, match="member name"):
        Pool.from_dict({"has space": {"model": "openai/x"}})


def test_a_misspelt_key_suggests_the_setting_meant(tmp_path) -> None:
    path = tmp_path / "pool.yaml"
    path.write_text("models:\n  a: {model: openai/a, temprature: 0}\n")
    with pytest.raises(PoolError, match=r"temprature \(did you mean temperature\?\)"):
        Pool.from_yaml(path)


def test_a_pool_file_prices_a_member_and_the_price_is_not_part_of_its_cache_key(tmp_path) -> None:
    from colab_graphs.models.cache import request_key
    from colab_graphs.models.client import ModelClient
    from colab_graphs.models.pricing import Price, member_price, price_source

    member = "{model: openai/m, api_base: 'http://127.0.0.1:9/v1', input_cost_per_token: %s, output_cost_per_token: 4.0e-7}"
    pools = [
        Pool.from_yaml(write_pool(tmp_path, f"models:\n  m: {member % price}\n"))["m"]
        for price in ("1.0e-7", "2.0e-7")
    ]
    assert member_price(pools[0]) == Price(1e-7, 4e-7) and price_source(pools[0]) == "pool"
    question = [{"role": "user", "content": "2 + 2?"}]
    keys = {request_key(ModelClient(None).canonical_request(m, question)[0]) for m in pools}
    assert len(keys) == 1  # a new price does not make earlier answers miss the cache
