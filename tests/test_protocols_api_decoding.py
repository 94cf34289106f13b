"""Token-level MoCo methods on tiny local models: nudging and co_llm, through the local provider.

Two members are the zoo's `tiny-random` with seeded perturbations (one vocabulary, other weights). Nudging is
checked against a plain re-implementation of its definition (full forward passes, no KV cache) and at its
extremes (gamma 1: the nudger alone; gamma 0: the nudger's first word, then the base). Co-LLM is checked at its
extremes (threshold 1: the base alone; a head that always defers: the reference alone), its deferral labels
against their definition, and its fit on dev through exact audits that count fits. Fits and merged folders go
to a fresh `COLAB_GRAPHS_MERGE_DIR` per test.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from colab_graphs.coalition import restrict
from colab_graphs.fitting import fit_coalition
from colab_graphs.models.client import ModelClient
from colab_graphs.pool import Pool
from colab_graphs.protocol_registry import build_protocol
from colab_graphs.protocols import dev_fit
from colab_graphs.protocols.api_decoding import deferral_labels, train_head
from colab_graphs.runner import run_dataset
from colab_graphs.tasks.example import Example
from colab_graphs.tasks.loaders import load_examples
from colab_graphs.tasks.scoring import register_scorer

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.slow

MEMBERS = ["m0", "m1"]
SCORER = "moco_test_nonempty"
GREEDY = {"temperature": 0, "max_tokens": 10}
QUESTION = Example(id="q", input="What is 2 + 3?", answer="5")


@register_scorer(SCORER)
def _nonempty(output: str, example) -> float:
    """Every reply that says something is "right": co_llm's dev texts are then every member's replies."""
    return 1.0 if (output or "").strip() else 0.0


@pytest.fixture(autouse=True)
def merge_dir(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("COLAB_GRAPHS_MERGE_DIR", str(tmp_path / "merges"))
    dev_fit._outcomes.clear()
    return tmp_path / "merges"


@pytest.fixture(scope="module")
def tiny(tiny_members) -> dict[str, Path]:
    return tiny_members(MEMBERS, 300)


@pytest.fixture(scope="module")
def pool(tiny) -> Pool:
    return Pool.from_dict({m: {"model": f"local/{tiny[m]}", **GREEDY} for m in MEMBERS})


@pytest.fixture
def data(tmp_path) -> dict[str, Path]:
    paths = {}
    for split, offset in (("dev", 10), ("test", 20)):
        rows = [
            {"id": f"{split}{i}", "input": f"What is {i + offset} + {i}?", "answer": str(2 * i + offset)}
            for i in range(2)
        ]
        paths[split] = tmp_path / f"{split}.jsonl"
        paths[split].write_text("".join(json.dumps(r) + "\n" for r in rows))
    return paths


def answer_of(spec, pool, example: Example = QUESTION) -> str:
    outcomes, _ = asyncio.run(run_dataset(spec, pool, [example], client=ModelClient(None), scorer=SCORER))
    assert not outcomes[0].failed, outcomes[0].error
    return outcomes[0].trace.state["answer"]


def solo(pool, member: str, members: list[str] = MEMBERS) -> str:
    return answer_of(build_protocol("solo", members, member=member), pool)


# --- nudging -------------------------------------------------------------------------------------------------------


def reference_nudging(base_dir: Path, nudger_dir: Path, question: str, gamma: float, max_tokens: int) -> str:
    """Nudging as its definition reads (MoCo's generate without KV cache), greedy, one shared vocabulary."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from colab_graphs.local.provider import get_engine

    tok = AutoTokenizer.from_pretrained(base_dir)
    models = [AutoModelForCausalLM.from_pretrained(d).eval() for d in (base_dir, nudger_dir)]
    messages = [{"role": "user", "content": question}]
    prompt = [get_engine(str(d)).render(messages) for d in (base_dir, nudger_dir)]
    eos = get_engine(str(base_dir)).eos_ids
    written: list[int] = []
    nudging, accepted = True, 0
    for _ in range(max_tokens):
        with torch.no_grad():
            logits = [
                m(torch.tensor([p + written])).logits[0, -1] for m, p in zip(models, prompt, strict=True)
            ]
        top1 = float(torch.softmax(logits[0], -1).max())
        b, n = int(logits[0].argmax()), int(logits[1].argmax())
        n_text = tok.decode(written[-16:] + [n])[len(tok.decode(written[-16:])) :]
        if nudging and (accepted == 0 or " " not in n_text or top1 < gamma):
            token, accepted = n, accepted + 1
        elif top1 >= gamma:
            token, nudging, accepted = b, False, 0
        else:
            token, nudging, accepted = n, True, 1
        if token in eos:
            break
        written.append(token)
    return tok.decode(written, skip_special_tokens=True)


@pytest.mark.parametrize("gamma", [0.0, 0.02, 0.05, 0.5])
def test_nudging_decodes_as_its_definition_reads(tiny, pool, gamma):
    spec = build_protocol("nudging", MEMBERS, gamma=gamma, prompt="{input}")
    expected = reference_nudging(tiny["m0"], tiny["m1"], QUESTION.input, gamma, GREEDY["max_tokens"])
    assert answer_of(spec, pool) == expected


def test_nudging_with_gamma_one_is_the_nudger_alone(pool):
    assert answer_of(build_protocol("nudging", MEMBERS, gamma=1.0), pool) == solo(pool, "m1")


def test_nudging_with_gamma_zero_takes_the_nudgers_first_word_then_the_base(pool):
    nudged = answer_of(build_protocol("nudging", MEMBERS, gamma=0.0), pool)
    assert nudged != solo(pool, "m0") and nudged != solo(pool, "m1")
    first = solo(pool, "m1")
    assert nudged[:1] == first[:1]


@pytest.fixture(scope="module")
def other_vocabulary(tmp_path_factory) -> Path:
    """A tiny random model with its own byte-level BPE vocabulary (trained offline on a few strings)."""
    from tokenizers import ByteLevelBPETokenizer
    from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

    folder = tmp_path_factory.mktemp("other-vocabulary") / "bpe"
    bpe = ByteLevelBPETokenizer()
    lines = ["What is 2 + 3? The answer is 5.", "User: hello Assistant: hi there"] * 10
    bpe.train_from_iterator(lines, vocab_size=300, special_tokens=["<|endoftext|>"])
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=bpe, eos_token="<|endoftext|>", pad_token="<|endoftext|>"
    )
    torch.manual_seed(0)
    config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        eos_token_id=tokenizer.eos_token_id,
    )
    Qwen2ForCausalLM(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def test_nudging_members_with_different_tokenizers_decode_together(tiny, other_vocabulary):
    from colab_graphs.local.guided import nudging
    from colab_graphs.local.provider import get_engine

    base = get_engine(str(tiny["m0"]))
    assert base.tokenizer.get_vocab() != get_engine(str(other_vocabulary)).tokenizer.get_vocab()
    pool = Pool.from_dict(
        {
            "m0": {"model": f"local/{tiny['m0']}", **GREEDY},
            "m1": {"model": f"local/{other_vocabulary}", **GREEDY},
        }
    )
    alone = answer_of(build_protocol("solo", MEMBERS, member="m1", prompt="{input}"), pool)
    result = nudging(
        str(tiny["m0"]),
        str(other_vocabulary),
        [{"role": "user", "content": QUESTION.input}],
        gamma=1.0,
        max_tokens=10,
    )
    # gamma 1: every piece is the nudger's (joined piece by piece: a split character shows as U+FFFD)
    assert result.text.replace("\ufffd", "") == alone.replace("\ufffd", "")
    # the base read the same text, in its own tokens
    read = base.tokenizer.decode(result.completion_ids)
    assert read.replace("\ufffd", "") == result.text.replace("\ufffd", "")
    assert answer_of(build_protocol("nudging", MEMBERS, gamma=0.5), pool)  # and through the provider


@pytest.mark.parametrize("member", MEMBERS)
def test_a_nudging_coalition_of_one_is_that_member_alone(pool, member):
    spec = restrict(build_protocol("nudging", MEMBERS), [member])
    assert spec.node("decode").members == [member]
    assert answer_of(spec, pool) == solo(pool, member)


def test_nudging_audit_scores_every_coalition(pool, data, tmp_path):
    from colab_graphs.audit.run import play_audit

    spec = build_protocol("nudging", MEMBERS, gamma=0.05)
    report = asyncio.run(
        play_audit(
            spec, pool, load_examples(data["test"]), client=ModelClient(None), method="exact", scorer=SCORER
        )
    )
    values = {tuple(c.members): c.value for c in report.coalitions}
    assert set(values) == {(), ("m0",), ("m1",), ("m0", "m1")} and values[()] == 0.0
    assert "fitting" not in report.model_dump()  # nothing to fit


# --- co_llm --------------------------------------------------------------------------------------------------------


def test_deferral_labels_mark_tokens_the_reference_gets_and_the_base_misses(tiny):
    from colab_graphs.local.provider import get_engine

    base, ref = get_engine(str(tiny["m0"])), get_engine(str(tiny["m1"]))
    prompt = base.render([{"role": "user", "content": "Say hi."}])
    target = base.tokenizer.encode(" hello there friend", add_special_tokens=False)
    states, labels = deferral_labels(base, ref, prompt, prompt, target)
    assert states.shape == (len(target), base.model.config.hidden_size)
    with torch.no_grad():
        b = base.model(torch.tensor([prompt + target])).logits[0, len(prompt) - 1 : -1].argmax(-1)
        r = ref.model(torch.tensor([prompt + target])).logits[0, len(prompt) - 1 : -1].argmax(-1)
    gold = torch.tensor(target)
    assert labels.tolist() == ((r == gold) & (b != gold)).float().tolist()


def test_the_deferral_head_learns_separable_labels():
    g = torch.Generator().manual_seed(0)
    states = torch.randn(200, 16, generator=g)
    labels = (states[:, 3] > 0.5).float()
    w, b = train_head(states, labels, weight_balance=1.0, epochs=300, learning_rate=0.05, seed=0)
    predicted = (torch.sigmoid(states @ torch.tensor(w) + b) > 0.5).float()
    assert (predicted == labels).float().mean() > 0.95


def test_co_llm_at_its_extremes_is_the_base_or_the_reference_alone(pool, tmp_path):
    from colab_graphs.protocols.api_decoding import SEAT

    always = tmp_path / "always.json"
    always.write_text(json.dumps({"w": [], "b": 50.0}))  # sigmoid(50) ~ 1: defer at every token
    spec = build_protocol("co_llm", MEMBERS, threshold=0.5)
    seat = spec.node(SEAT)
    deferring = spec.model_copy(
        update={
            "nodes": [
                seat.model_copy(update={"params": {**seat.params, "head": str(always)}}),
                *spec.nodes[1:],
            ]
        }
    )
    assert answer_of(deferring, pool) == solo(pool, "m1")
    never = deferring.model_copy(
        update={
            "nodes": [
                seat.model_copy(update={"params": {**seat.params, "head": str(always), "threshold": 1.0}}),
                *spec.nodes[1:],
            ]
        }
    )
    assert answer_of(never, pool) == solo(pool, "m0")


def test_co_llm_fits_a_head_on_dev_and_runs_with_it(pool, data):
    spec = build_protocol("co_llm", MEMBERS, dev=str(data["dev"]), epochs=20)
    fitted = asyncio.run(fit_coalition(spec, pool, client=ModelClient(None), scorer=SCORER))
    result = fitted.record["result"]
    assert fitted.record["fitted"] is True and result["texts"] == 4  # both members' replies to both questions
    assert result["tokens"] > 0 and 0 <= result["deferrals"] <= result["tokens"]
    head = Path(fitted.spec.node("decode").params["head"])
    assert len(json.loads(head.read_text())["w"]) == 64  # tiny-random's hidden size
    assert answer_of(fitted.spec, pool)  # decodes with the head


def test_a_co_llm_run_without_its_fit_fails_naming_the_step(pool):
    spec = build_protocol("co_llm", MEMBERS)
    outcomes, _ = asyncio.run(run_dataset(spec, pool, [QUESTION], client=ModelClient(None, retries=0)))
    assert outcomes[0].failed and "fit step" in outcomes[0].error


def test_co_llm_audit_fits_once_and_a_second_audit_reuses_the_fit(pool, data, tmp_path):
    from colab_graphs.audit.run import play_audit

    def audit(out: Path):
        spec = build_protocol("co_llm", MEMBERS, dev=str(data["dev"]), epochs=20)
        examples = load_examples(data["test"])
        return asyncio.run(
            play_audit(spec, pool, examples, client=ModelClient(None), method="exact", scorer=SCORER, out=out)
        )

    before = dev_fit.stats.done
    first = audit(tmp_path / "a")
    records = {tuple(r["members"]): r for r in first.fitting["coalitions"]}
    assert records[("m0", "m1")]["fitted"] is True
    assert records[("m0",)]["fitted"] is None and records[("m1",)]["fitted"] is None
    assert first.fitting["fits"]["made"] == dev_fit.stats.done - before == 1
    dev_fit._outcomes.clear()
    again = audit(tmp_path / "b")
    assert dev_fit.stats.done - before == 1
    assert again.fitting["fits"] == {"made": 0, "reused": 1, "fit_s": 0}
    values = {tuple(c.members): c.value for c in first.coalitions}
    assert {tuple(c.members): c.value for c in again.coalitions} == values and values[()] == 0.0
