"""The C-RL study's `pick` seat (bench/crl_team*.py): named teammates, each right on the questions one cue word
marks; the policy picks one. The questions and teammates do what the seat's design says, the reading of a
pick resists replies written to fool it, and a tiny real study (SmolLM2-135M from the offline zoo, real TRL
updates, the positive control's supervised updates) runs end to end through the study's own commands: its
constants recompute from its rows, each trained policy's weights moved, each arm trained on its own reward."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from colab_graphs.tasks.example import Example
from colab_graphs.tasks.scoring import view_for

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))

import crl_team_graphs as team  # noqa: E402


def test_each_teammate_is_right_exactly_on_its_cue_words_and_the_right_answer_has_no_fixed_rank() -> None:
    train, held = team.pick_questions(300, 90)
    keys = {team.question_key(r["input"]) for r in train}
    assert not [r for r in held if team.question_key(r["input"]) in keys]  # never trained on
    assert {r["kind"] for r in held} == set(team.PICK_TEAMMATES)
    assert sum(r["kind"] == "ana" for r in held) == 30  # a third each
    ranks = set()
    for r in [*train, *held]:
        answers = team.pick_answers(r["input"])
        assert answers is not None and len(set(answers.values())) == 3, r
        right = [n for n, a in answers.items() if a == int(r["answer"])]
        assert right == [team.OWNER[r["cue"]]] == [r["kind"]], r
        ranks.add(sorted(answers.values()).index(int(r["answer"])))
    # Smallest, middle and largest all occur: no number comparison finds the right one.
    assert ranks == {0, 1, 2}
    assert team.pick_answers("What is 47 + 38?") is None  # no cue: not a pick question
    reply = team.pick_teammate("ben")([{"role": "user", "content": held[0]["input"]}], {"seed": 1})
    assert str(team.pick_answers(held[0]["input"])["ben"]) in reply


@pytest.mark.parametrize(
    ("reply", "first", "chosen", "how"),
    [
        ("The answer is 85.", "name", "cal", "number"),
        ("\\boxed{95}", "number", "ana", "number"),
        ("Ben is right.", "number", "ben", "name"),
        ("**Cal**", "name", "cal", "name"),
        ("Ben: 85", "name", "ben", "name"),  # the seat asks for a name: the name decides
        ("Ben: 85", "number", "cal", "number"),  # the seat asks for a number: the number decides
        ("Ana or Ben.", "name", "ana", "none"),  # two names: no pick, the first shown stands
        ("Ana or Ben: 85.", "name", "cal", "number"),  # two names, one committed number
        ("Banana bread.", "name", "ana", "none"),  # a name inside a word names nobody
        ("The answer is 90.", "number", "ana", "none"),  # a number no teammate gave
        ("Ben says 75, but the answer is 85.", "number", "cal", "number"),  # the committed number decides
        ("", "name", "ana", "none"),
    ],
)
def test_a_pick_is_read_from_one_name_or_the_committed_number_and_nothing_else(
    reply: str, first: str, chosen: str, how: str
) -> None:
    view = view_for(Example(id="q", input="Bank question: What is 40 + 45?", answer="85"))
    named = [("ana", "95"), ("ben", "75"), ("cal", "85")]
    assert team.picked(reply, named, view, first) == (chosen, how)


@pytest.mark.parametrize(
    ("reply", "pick_answer", "brief_answer"),
    [
        ("Cal.", "85", "85"),  # a pick stands in both seats
        ("Elon Musk is", "95", ""),  # a name that is no teammate's: `pick` hands the first shown the question
        ("Ana or Ben.", "95", ""),  # two names pick nobody
        ("The answer is 90.", "95", ""),  # a number no teammate gave
    ],
)
def test_a_reply_that_picks_nobody_leaves_the_brief_seats_team_without_an_answer(
    reply: str, pick_answer: str, brief_answer: str
) -> None:
    view = view_for(Example(id="q", input="Bank question: What is 40 + 45?", answer="85"))
    shown = team.pick_named("Bank question: What is 40 + 45?", team.PICK_TEAMMATES)
    answers = dict(zip(shown, ("The answer is 95.", "I get 75.", "\\boxed{85}"), strict=True))
    inputs = {"question": "Bank question: What is 40 + 45?", **answers, "choice": reply}
    first = view.extract(answers[shown[0]])
    assert first == "95" and view.extract(answers["cal"]) == "85"
    assert team.team_pick(inputs, task=view) == pick_answer
    assert team.team_pick(inputs, task=view, unpicked="none") == brief_answer
    # The seats wire it so: `pick` falls back to the first shown, `pick_brief` to no answer.
    finals = {
        name: next(n for n in team.GRAPHS[name](["policy", *team.PICK_TEAMMATES]).nodes if n.name == "final")
        for name in ("pick", "pick_brief")
    }
    assert (
        finals["pick"].params.get("unpicked") == "first" and finals["pick_brief"].params["unpicked"] == "none"
    )


def test_the_positive_control_is_taught_the_reply_its_seat_asks_for() -> None:
    import crl_team_control

    example = Example(**team.pick_questions(3, 3)[1][2])  # a Ben question
    assert example.fields["kind"] == "ben"
    named = crl_team_control.oracle_reply({"graph": "crl_team_graphs:pick"}, example)
    number = crl_team_control.oracle_reply({"graph": "crl_team_graphs:pick_number"}, example)
    assert named == "Ben." and number == f"The answer is {example.answer}."
    # Both are read by the team as a pick of the right teammate.
    view = view_for(example)
    answers = team.pick_answers(example.input)
    assert answers is not None
    shown = [(n, str(answers[n])) for n in team.pick_named(example.input, team.PICK_TEAMMATES)]
    assert team.picked(named, shown, view)[0] == team.picked(number, shown, view)[0] == "ben"


@pytest.mark.slow
@pytest.mark.timeout(1500)  # three trainings and four evaluations of a 135M policy on 2 shared cores
def test_a_dev_split_is_carved_from_the_training_questions_and_never_holds_a_held_out_one(
    tmp_path: Path,
) -> None:
    """`--dev-size`: a setting is chosen on the last training questions, not trained on, and the folder it is
    chosen in holds no held-out question at all."""
    import crl_team

    train, held = team.pick_questions(300, 60)
    paths = crl_team.write_data(tmp_path, 300, 60, ["pick_brief"], dev=60)
    fit, dev = ([json.loads(x) for x in p.read_text().splitlines()] for p in paths[:2])
    assert fit == train[:240] and dev == train[240:]
    assert {r["kind"] for r in dev} == set(team.PICK_TEAMMATES)  # every teammate's cues, as in training
    written = {r["input"] for r in [*fit, *dev]}
    assert not written & {r["input"] for r in held}
    with pytest.raises(SystemExit, match="--dev-size"):
        crl_team.write_data(tmp_path, 6, 3, ["pick_brief"], dev=6)


def test_a_tiny_pick_study_runs_end_to_end_with_its_positive_control(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import crl_team
    import crl_team_pick_report as pick_report
    import crl_team_report as report
    from safetensors.torch import load_file

    from colab_graphs.local.zoo import resolve

    study, pack = tmp_path / "study", tmp_path / "pack"
    argv = [
        "crl_team.py", "--out", str(study), "--settings", "pick_brief", "--arms", "control", "own", "uniform",
        "--seeds", "0", "--steps", "2", "--prompts", "1", "--eval-size", "3", "--train-size", "6",
        "--tokens", "4", "--lr", "1e-3", "--lr-schedule", "constant", "--temperature", "1.0",
        "--save-steps", "1", "--curve-steps", "1", "--entropy-target", "0.5",
    ]  # fmt: skip
    monkeypatch.setattr(sys, "argv", argv)
    crl_team.main()
    printed = capsys.readouterr().out
    assert '"evaluated": "pick_brief-control-0"' in printed and '"trained": "pick_brief-uniform-0"' in printed
    manifest = json.loads((study / "manifest.json").read_text())
    assert manifest["lr_schedule"] == "constant" and "dirty_paths" in manifest
    assert manifest["temperature"] == 1.0 and manifest["curve_steps"] == [1]
    # The entropy floor is the RL arms' (the control's loss is supervised, and has none).
    arms = manifest["config"]["pick_brief"]
    assert arms["uniform"]["use_adaptive_entropy"] and arms["own"]["entropy_target"] == 0.5
    assert "use_adaptive_entropy" not in arms["control"] and "use_adaptive_entropy" not in arms["sft"]
    # The whole tree's changed paths, each whole, as git lists them (the study writes outside the tree).
    status = subprocess.run(
        ["git", "status", "--porcelain", "--", ":/"], cwd=ROOT, capture_output=True, text=True
    )
    changed = {line[3:] for line in status.stdout.splitlines() if line.strip()}
    assert set(manifest["dirty_paths"]) <= changed and manifest["tree_dirty"] == bool(changed)
    # The brief seat's policy is shown its persona, not SmolLM2's default one.
    rollout = json.loads((study / "runs" / "pick_brief-uniform-0" / "rollouts.jsonl").open().readline())
    seat = next(t for t in rollout["turns"] if t["seat"] == "pick")
    assert seat["messages"][0] == {"role": "system", "content": team.PICK_PERSONA}
    # A policy moved away from the starting weights exactly when one of its updates had a gradient (LoRA's B
    # starts at 0: a GRPO arm whose groups all scored alike keeps the base weights); the control always moves.
    # The learning rate is constant; `own` trained on the policy's own correctness, C-RL on the team's.
    base = load_file(str(resolve("smollm2-135m") / "model.safetensors"))
    for arm in ("control", "own", "uniform"):
        lines = [json.loads(x) for x in (study / "runs" / f"pick_brief-{arm}-0" / "metrics.jsonl").open()]
        assert len(lines) == 2 and {x["learning_rate"] for x in lines} == {1e-3}, arm
        assert arm == "control" or all(0 <= x["groups_varied"] <= 1 for x in lines), arm
        # Each training's held-out curve point: its adapter at update 1, evaluated on every held-out question.
        curve = [json.loads(x) for x in (study / "rows" / f"pick_brief-{arm}-0-at-1-audit.jsonl").open()]
        assert len(curve) == 3 and {(x["eval"], x["step"]) for x in curve} == {("curve", 1)}, arm
        moved = load_file(str(study / "runs" / f"pick_brief-{arm}-0" / "policy" / "model.safetensors"))
        name = next(k for k in moved if k.endswith("layers.0.self_attn.q_proj.weight"))
        pushed = any(x["grad_norm"] > 0 for x in lines)
        assert bool((moved[name] - base[name]).abs().max() > 0) == pushed, arm
        assert pushed or arm != "control"
    own = [json.loads(x) for x in (study / "runs" / "pick_brief-own-0" / "metrics.jsonl").open()]
    assert all(x["reward"] == x["policy_correct"] for x in own)
    assert all("entropy_coef" in x for x in own)  # TRL's controller ran in the RL arms
    # The report, from the pack alone: the constants recompute from the untrained policy's rows.
    pick_report.main([str(study), "--pack", str(pack)])
    summary, text = pick_report.build(pack)
    rows = [r for r in report.read_rows(pack) if r["arm"] == "before" and r["eval"] == "audit"]
    floor = sum(r["slots_right"][0] for r in rows) / len(rows)
    assert summary["constants"]["floor"] == pytest.approx(floor) and summary["constants"]["oracle"] == 1.0
    copies = [summary["constants"][f"copy-{m}"] for m in team.PICK_TEAMMATES]
    assert sum(copies) == pytest.approx(1.0)  # exactly one teammate is right on each question
    assert "| C-RL, uniform credit (team reward) minus RL on the policy's own correctness" in text
    assert "**primary**" in text and "| positive control: supervised on the oracle's answer | 0 |" in text
    assert "| arm | 0 (0) | 1 (4) | 2 (8, final) |" in text  # the held-out curves (4 rollouts an update)
    assert "Share of groups (a question's 4 rollouts) whose rewards differ" in text
    # A tampered constant row is refused.
    shipped = report.read_rows(pack)
    for r in shipped:
        if r["arm"] == "oracle":
            r["score"] = 0.0
            break
    report._gzip_lines(pack / "rows.jsonl.gz", shipped)
    with pytest.raises(SystemExit, match="constant oracle"):
        pick_report.build(pack)


@pytest.mark.parametrize(
    "study",
    [
        "crl_pick",
        "crl_pick_number",
        "crl_brief_group",
        "crl_brief_batch",
        "crl_brief_warm",
        "crl_brief_q8",
        "crl_brief_gpu",
    ],
)
def test_the_study_page_tables_are_rebuilt_from_the_shipped_rows_alone(tmp_path: Path, study: str) -> None:
    import shutil

    import crl_team_pick_report as pick_report

    shipped = ROOT / "bench" / "results" / study
    folder = tmp_path / study
    shutil.copytree(shipped, folder)
    for made in ("summary.json", "table.md"):
        (folder / made).unlink()
    summary, text = pick_report.build(folder)
    manifest = json.loads((folder / "manifest.json").read_text())
    start, end = pick_report.markers(manifest)
    page = (ROOT / "docs" / "crl-study.md").read_text()
    assert page.split(start, 1)[1].split(end, 1)[0] == "\n" + text
    assert text == (shipped / "table.md").read_text()
    # The control's gap closed (floor -> oracle) is the one the page states for the seat (a study being
    # packed seed by seed may not have its control yet).
    if "control" in summary["arms"]:
        closed = summary["arms"]["control"]["gap_closed"][0]
        assert f"{closed:+.3f}" in page.split(start, 1)[1].split(end, 1)[0]
    assert study == "crl_brief_q8" or "control" in summary["arms"]  # (every finished study has one)


def test_the_exploration_sweep_table_is_rebuilt_from_its_shipped_rows_alone(tmp_path: Path) -> None:
    """The sweep that chose the exploration setting: its table, on the study page, comes from its pack alone
    (every candidate's dev rows, metrics and logged replies), and the pack holds no held-out question."""
    import shutil

    import crl_team_sweep as sweep

    shipped = ROOT / "bench" / "results" / "crl_brief_sweep"
    folder = tmp_path / "sweep"
    shutil.copytree(shipped, folder)
    for made in ("summary.json", "table.md"):
        (folder / made).unlink()
    sweep.main([str(folder)])
    text = (folder / "table.md").read_text()
    assert text == (shipped / "table.md").read_text()
    page = (ROOT / "docs" / "crl-study.md").read_text()
    assert (
        page.split("<!-- crl-brief-sweep-table -->\n", 1)[1].split("<!-- /crl-brief-sweep-table -->")[0]
        == text
    )
    _, held = team.pick_questions(300, 60)
    held_inputs = {r["input"] for r in held}
    for candidate in folder.glob("*/rows.jsonl.gz"):
        assert not held_inputs & {r["input"] for r in sweep._lines(candidate) if "input" in r}, candidate
    # Reading a pick: a reply names exactly one teammate, or it is not one.
    assert sweep.one_name("Ben: 95") and sweep.one_name("Ana is right, Ana.")
    assert not sweep.one_name("Ana or Ben") and not sweep.one_name("Benjamin") and not sweep.one_name("")


def test_readme_and_the_study_summary_state_the_shipped_rows_numbers() -> None:
    """README's C-RL line, docs/crl.md and the study page's summary quote the latest study's figures as its
    shipped summary computes them from the rows (C-RL's held-out team score and the primary C-RL minus SFT)."""
    summary = json.loads((ROOT / "bench" / "results" / "crl_brief_gpu" / "summary.json").read_text())
    team = "{:.3f} [{:.3f}, {:.3f}]".format(*summary["arms"]["uniform"]["team"])
    versus_sft = "{:+.3f} [{:+.3f}, {:+.3f}]".format(*summary["pairs"]["uniform - sft"]["diff"])
    versus_own = "{:+.3f} [{:+.3f}, {:+.3f}]".format(*summary["pairs"]["uniform - own"]["diff"])
    page = (ROOT / "docs" / "crl-study.md").read_text()
    first = page.split("<!-- crl-summary -->", 1)[1].split("<!-- /crl-summary -->", 1)[0]
    for name, text in (
        ("README.md", " ".join((ROOT / "README.md").read_text().split())),
        ("docs/crl.md", " ".join((ROOT / "docs" / "crl.md").read_text().split())),
        ("docs/crl-study.md's summary", " ".join(first.split())),
    ):
        assert team in text and versus_sft in text and versus_own in text, (
            name,
            team,
            versus_sft,
            versus_own,
        )
