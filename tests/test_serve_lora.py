"""vLLM's contract on `colab-graphs serve`: token ids in responses, processed logprobs, LoRA adapters loaded
and unloaded at run time over HTTP (real server, real tiny model, real PEFT adapters)."""

from __future__ import annotations

import json
import os
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest

import colab_graphs._env  # noqa: F401
from colab_graphs.local.local_engine import LocalEngine
from colab_graphs.local.provider import build_request, get_engine
from colab_graphs.local.zoo import resolve
from colab_graphs.serve.server import start_server

QUESTION = [{"role": "user", "content": "What is 2+2? Answer with a number."}]


def _post(base_url: str, route: str, body: dict[str, Any]) -> tuple[int, Any]:
    req = urllib.request.Request(
        f"{base_url.removesuffix('/v1')}{route}",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(req, timeout=120) as resp:
            raw = resp.read().decode()
            return resp.status, json.loads(
                raw
            ) if resp.headers.get_content_type() == "application/json" else raw
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())


def _get(base_url: str, route: str) -> Any:
    with urllib.request.urlopen(f"{base_url.removesuffix('/v1')}{route}", timeout=60) as resp:
        return json.loads(resp.read())


def make_adapter(folder: Path, base: Path, seed: int, r: int = 4) -> Path:
    """A PEFT LoRA adapter on `base` with random (non-zero) A and B, saved as save_pretrained saves it."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
    peft = get_peft_model(
        model, LoraConfig(r=r, lora_alpha=8, target_modules="all-linear", task_type="CAUSAL_LM")
    )
    with torch.no_grad():
        for name, param in peft.named_parameters():
            if "lora_B" in name:
                param.normal_(0, 0.5)
    peft.save_pretrained(folder)
    return folder


def merged_engine(adapter: Path, base: Path) -> LocalEngine:
    """The adapter applied in process by PEFT itself (merge_and_unload): what the server must decode with."""
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
    merged = PeftModel.from_pretrained(model, adapter).merge_and_unload().eval()
    return LocalEngine(merged, AutoTokenizer.from_pretrained(base), name="peft-merged")


@pytest.fixture(scope="module")
def base() -> Path:
    return resolve("tiny-random")


@pytest.fixture(scope="module")
def server():
    with start_server("tiny-random", served_name="tiny", enable_lora=True, max_adapters=2) as srv:
        yield srv


def _chat(server: Any, model: str, **extra: Any) -> tuple[int, Any]:
    body = {"model": model, "messages": QUESTION, "temperature": 0, "max_tokens": 8, **extra}
    return _post(server.base_url, "/v1/chat/completions", body)


def test_return_token_ids_gives_vllms_fields_in_chat_and_completions(server) -> None:
    engine = get_engine("tiny-random")
    alone = engine.generate(build_request(engine, QUESTION, {"temperature": 0, "max_tokens": 8}))
    status, payload = _chat(server, "tiny", return_token_ids=True, logprobs=True)
    assert status == 200, payload
    assert payload["prompt_token_ids"] == alone.prompt_ids  # vLLM: top-level in a chat response
    choice = payload["choices"][0]
    assert choice["token_ids"] == alone.completion_ids
    assert [e["logprob"] for e in choice["logprobs"]["content"]] == pytest.approx(alone.logprobs, abs=1e-5)
    status, plain = _chat(server, "tiny")
    assert "prompt_token_ids" not in plain and "token_ids" not in plain["choices"][0]  # only when asked
    body = {"model": "tiny", "prompt": "2+2=", "max_tokens": 4, "temperature": 0, "return_token_ids": True}
    status, completion = _post(server.base_url, "/v1/completions", body)
    assert status == 200, completion
    first = completion["choices"][0]  # vLLM: each completion choice carries both
    assert first["prompt_token_ids"] == engine.tokenizer("2+2=")["input_ids"]
    assert len(first["token_ids"]) == completion["usage"]["completion_tokens"]
    status, refused = _chat(server, "tiny", return_token_ids=True, stream=True)
    assert status == 400 and refused["error"]["param"] == "return_token_ids"


def test_processed_logprobs_are_those_of_the_distribution_each_token_was_drawn_from(server) -> None:
    sampling = {"temperature": 0.7, "top_k": 5, "seed": 11, "max_tokens": 6, "logprobs": True}
    engine = get_engine("tiny-random")
    request = build_request(engine, QUESTION, sampling)
    request.logprobs_mode = "processed"
    alone = engine.generate(request)
    with start_server("tiny-random", served_name="tiny", logprobs_mode="processed_logprobs") as srv:
        status, payload = _chat(srv, "tiny", **sampling, return_token_ids=True)
    assert status == 200, payload
    choice = payload["choices"][0]
    assert choice["token_ids"] == alone.completion_ids  # vLLM's top_k and seed honoured as in process
    served = [e["logprob"] for e in choice["logprobs"]["content"]]
    assert served == pytest.approx(alone.logprobs, abs=1e-5)
    # the raw-mode server draws the same tokens and reports the model's untempered, untruncated logprobs
    status, raw = _chat(server, "tiny", **sampling, return_token_ids=True)
    assert raw["choices"][0]["token_ids"] == alone.completion_ids
    raw_logprobs = [e["logprob"] for e in raw["choices"][0]["logprobs"]["content"]]
    assert all(r < p for r, p in zip(raw_logprobs, served, strict=True))  # top-5 renormalised: more mass each


def test_an_adapter_loaded_over_http_decodes_as_peft_merges_it_and_only_for_its_name(
    server, base, tmp_path
) -> None:
    adapter = make_adapter(tmp_path / "a1", base, seed=1)
    status, text = _post(
        server.base_url, "/v1/load_lora_adapter", {"lora_name": "a1", "lora_path": str(adapter)}
    )
    assert (status, text) == (200, "Success: LoRA adapter 'a1' added successfully.")  # vLLM's words
    cards = {m["id"]: m for m in _get(server.base_url, "/v1/models")["data"]}
    assert cards["a1"]["parent"] == "tiny" and cards["a1"]["root"] == str(adapter.resolve())
    peft = merged_engine(adapter, base)
    expected = peft.generate(build_request(peft, QUESTION, {"temperature": 0, "max_tokens": 8}))
    status, with_adapter = _chat(server, "a1", return_token_ids=True)
    assert status == 200, with_adapter
    assert with_adapter["choices"][0]["token_ids"] == expected.completion_ids
    assert with_adapter["model"] == "a1"
    status, base_reply = _chat(server, "tiny", return_token_ids=True)
    assert base_reply["choices"][0]["token_ids"] != expected.completion_ids  # the base is untouched

    # again without load_inplace: refused as vLLM refuses it; with it: replaced
    status, again = _post(
        server.base_url, "/v1/load_lora_adapter", {"lora_name": "a1", "lora_path": str(adapter)}
    )
    assert status == 400 and "load_inplace" in again["error"]["message"]
    other = make_adapter(tmp_path / "a2", base, seed=2)
    body = {"lora_name": "a1", "lora_path": str(other), "load_inplace": True}
    assert _post(server.base_url, "/v1/load_lora_adapter", body)[0] == 200
    peft2 = merged_engine(other, base)
    expected2 = peft2.generate(build_request(peft2, QUESTION, {"temperature": 0, "max_tokens": 8}))
    status, replaced = _chat(server, "a1", return_token_ids=True)
    assert replaced["choices"][0]["token_ids"] == expected2.completion_ids

    status, text = _post(server.base_url, "/v1/unload_lora_adapter", {"lora_name": "a1"})
    assert (status, text) == (200, "Success: LoRA adapter 'a1' removed successfully.")
    status, gone = _chat(server, "a1")
    assert status == 404 and gone["error"]["param"] == "model" and "a1" in gone["error"]["message"]
    status, unknown = _post(server.base_url, "/v1/unload_lora_adapter", {"lora_name": "a1"})
    assert status == 404 and unknown["error"]["message"] == "The lora adapter 'a1' cannot be found."


def test_bad_adapters_are_refused_naming_the_fault(server, base, tmp_path) -> None:
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    def load(path: Path | str, name: str = "bad") -> tuple[int, Any]:
        return _post(server.base_url, "/v1/load_lora_adapter", {"lora_name": name, "lora_path": str(path)})

    status, missing = load(tmp_path / "nowhere")
    assert (
        status == 404
        and missing["error"]["param"] == "lora_path"
        and "not a folder" in missing["error"]["message"]
    )
    (tmp_path / "empty").mkdir()
    status, empty = load(tmp_path / "empty")
    assert status == 404 and "adapter_config.json" in empty["error"]["message"]

    # an adapter trained on another model (wider): its base is not the served model
    config = AutoConfig.from_pretrained(base)
    config.hidden_size, config.intermediate_size = config.hidden_size * 2, config.intermediate_size * 2
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(config).save_pretrained(tmp_path / "wide")
    wide = make_adapter(tmp_path / "on-wide", tmp_path / "wide", seed=3)
    status, other = load(wide)
    assert status == 400 and other["error"]["code"] == "base_model_mismatch"
    assert "not on the served model tiny" in other["error"]["message"]
    # the same adapter claiming the served model as its base: refused by its shapes, naming a module
    claimed = json.loads((wide / "adapter_config.json").read_text())
    claimed["base_model_name_or_path"] = str(base)
    (wide / "adapter_config.json").write_text(json.dumps(claimed))
    status, shapes = load(wide)
    assert status == 400 and shapes["error"]["code"] == "base_model_mismatch"
    assert (
        "lora_A" in shapes["error"]["message"] and "the served model has shape" in shapes["error"]["message"]
    )
    status, named = load(make_adapter(tmp_path / "ok", base, seed=4), name="tiny")
    assert status == 400 and named["error"]["param"] == "lora_name"
    status, extra = _post(
        server.base_url, "/v1/load_lora_adapter", {"lora_name": "x", "lora_path": "y", "lora_rank": 2}
    )
    assert status == 400 and extra["error"]["param"] == "lora_rank"
    assert [m["id"] for m in _get(server.base_url, "/v1/models")["data"]] == ["tiny"]  # nothing half-loaded


def test_adapter_routes_exist_only_when_enabled(tmp_path) -> None:
    with start_server("tiny-random", served_name="tiny") as plain:
        status, payload = _post(plain.base_url, "/v1/load_lora_adapter", {"lora_name": "a", "lora_path": "b"})
    assert status == 404 and payload["error"]["code"] == "not_found"


def test_the_users_vllm_command_asks_for_runtime_adapters_and_processed_logprobs(base) -> None:
    """docs/crl.md's policy server on a GPU: `colab-graphs serve smollm2-135m --backend vllm --enable-lora
    --logprobs-mode processed_logprobs` runs this vLLM command line in this environment (vLLM is not
    installed here: the command and its environment are what can be checked)."""
    from colab_graphs.serve.server import vllm_command, vllm_env

    command = vllm_command("tiny-random", "127.0.0.1", 8000, None, "processed_logprobs", enable_lora=True)
    assert command[1:3] == ["serve", str(base)]
    assert command[3:] == [
        "--host", "127.0.0.1", "--port", "8000", "--served-model-name", "tiny-random",
        "--logprobs-mode", "processed_logprobs", "--enable-lora",
    ]  # fmt: skip
    assert vllm_env(True)["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] == "True"
    assert "VLLM_ALLOW_RUNTIME_LORA_UPDATING" not in vllm_env(False) or os.environ.get(
        "VLLM_ALLOW_RUNTIME_LORA_UPDATING"
    )
