"""The C-RL team study (bench/crl_team*.py): the team's credit is not the policy's, the held-out questions are
never trained on, the critic's verdict parser resists replies written to fool it, and docs/crl.md's C-RL table is
what the shipped rows give (bench/results/crl_team), rebuilt by the report script alone."""

from __future__ import annotations

import json
import re
import shutil
import sys
from pathlib import Path

import pytest

from colab_graphs import api
from colab_graphs.tasks.example import Example
from colab_graphs.testing.scripts import last_user_text, member_from_config

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))

import crl_team_graphs as team  # noqa: E402
import crl_team_report as report  # noqa: E402

SHIPPED = ROOT / "bench" / "results" / "crl_team"


def test_held_out_questions_are_never_trained_on_operand_order_included() -> None:
    train, held = team.questions(600, 300)
    assert len(held) == 300 and len(train) == 600
    keys = {team.question_key(r["input"]) for r in train}
    assert not [r for r in held if team.question_key(r["input"]) in keys]
    assert team.question_key("What is 47 + 38?") == team.question_key("What is 38 + 47?")
    assert team.question_key("What is 23 - 61?") != team.question_key("What is 61 - 23?")
    assert {r["kind"] for r in held} == set(team.KINDS)
    # A longer training list keeps the held-out set (the study can grow without moving its test questions).
    assert team.questions(900, 300)[1] == held


def test_the_transfer_task_shares_no_question_and_keeps_the_skill_split() -> None:
    train, held = team.questions(600, 300)
    transfer = team.transfer_questions(300)
    seen = {team.question_key(r["input"]) for r in [*train, *held]}
    assert len(transfer) == 300 and not [r for r in transfer if team.question_key(r["input"]) in seen]
    assert {r["kind"] for r in transfer} == {"big-add", "big-mul", "big-sub"}
    for r in transfer:
        add, mul = (team.specialist_answer(s, r["input"]) for s in ("add", "mul"))
        right = (add == int(r["answer"]), mul == int(r["answer"]))
        expected = {"big-add": (True, False), "big-mul": (False, True), "big-sub": (False, False)}[r["kind"]]
        assert right == expected, r
        assert r["kind"] != "big-sub" or add == mul  # both wrong with the same answer
    assert team.transfer_questions(300) == transfer  # drawn from a fixed seed


def test_specialists_are_right_by_question_type() -> None:
    answers = {
        "What is 47 + 38?": (85, 95),  # add: adder right, multiplier forgets a carry
        "What is 7 * 23?": (168, 161),  # mul: adder adds a group, multiplier right
        "What is 4 + 5?": (9, 9),  # easy: both right
        "What is 23 - 61?": (38, 38),  # sub: both drop the sign, alike
    }
    for question, expected in answers.items():
        assert (team.specialist_answer("add", question), team.specialist_answer("mul", question)) == expected
    reply = team.teammate("add")([{"role": "user", "content": "What is 47 + 38?\n\nAnswer."}], {"seed": 3})
    assert "85" in reply and reply in {p.format(a=85) for p in team.PHRASINGS}


@pytest.mark.parametrize(
    ("reply", "verdict"),
    [
        ("correct", True),
        ("**Correct.** The teammate is right.", True),
        ("Incorrect.", False),
        ("The answer is not correct.", False),
        ("That isn't right: 7 * 23 is 161.", False),
        ("Wrong, it should be 95.", False),
        ("No.", False),
        ("Yes, correct.", True),
        ("The answer is 85.", None),  # commits to no verdict: the answer stands
        ("", None),
        ("Not correct. The correct answer is 95.", False),  # the first verdict decides
        ("It is correct that this is wrong.", True),  # it does not read reasoning (documented)
    ],
)
def test_the_critic_verdict_resists_replies_written_to_fool_it(reply: str, verdict: bool | None) -> None:
    assert team.verdict(reply) is verdict


def _proposer(mode: str):  # noqa: ANN202
    """A scripted policy for the vote that replies as a model does: the right answer, or a wrong one of its own."""

    def script(messages, params):  # noqa: ANN001, ANN202
        text = last_user_text(messages)
        a, op, b = (
            int(x) if x.lstrip("-").isdigit() else x
            for x in re.match(r"What is (\S+) (\S) (\S+)\?", text).groups()
        )
        right = a + b if op == "+" else a - b if op == "-" else a * b
        if mode == "right":
            return f"Let me check. {a} {op} {b} = {right}. The answer is {right}."
        return f"The answer is {right + 1000}."

    return script


def _critic(reply: str):  # noqa: ANN202
    return lambda messages, params: reply


@pytest.fixture
def held() -> list[Example]:
    return [Example(**r) for r in team.questions(40, 60)[1]]


def _audit(arun, server, pool_for, setting: str, held: list[Example], swap: bool = False):  # noqa: ANN001, ANN202
    pool = pool_for(server, ["policy", *team.TEAMMATES], temperature=0.7)
    spec = team.GRAPHS[setting](pool.names, swap=swap)
    return arun(api.arun_audit(spec, pool, held, method="exact", progress=False))


def test_the_vote_team_is_right_when_the_policy_is_wrong_and_wrong_when_it_is_right(
    arun, scripted_server, pool_for, held: list[Example]
) -> None:
    teammates = {n: member_from_config(c) for n, c in team.teammate_configs().items()}
    right = _audit(arun, scripted_server({**teammates, "policy": _proposer("right")}), pool_for, "vote", held)
    own = _audit(arun, scripted_server({**teammates, "policy": _proposer("own")}), pool_for, "vote", held)
    subs = sum(e.fields["kind"] == "sub" for e in held) / len(held)
    # A policy that is always right alone loses every `sub` question in the team (two teammates outvote it) ...
    assert right.individual["policy"] == 1.0
    assert right.value_of(["policy", *team.TEAMMATES]) == pytest.approx(1 - subs)
    # ... and one that is always wrong alone leaves the team slot 1's answer, right on many questions.
    assert own.individual["policy"] == 0.0
    slot1 = own.value_of(list(team.TEAMMATES))  # without the policy the teammates tie: slot 1 stands
    assert own.value_of(["policy", *team.TEAMMATES]) == pytest.approx(slot1) and slot1 > 0.3
    assert own.loo["policy"] == pytest.approx(0.0)
    assert right.loo["policy"] > 0.2


@pytest.mark.slow
def test_the_gate_hands_a_rejected_answer_to_slot_2_and_the_swap_reverses_the_slots(
    arun, scripted_server, pool_for, held: list[Example]
) -> None:
    teammates = {n: member_from_config(c) for n, c in team.teammate_configs().items()}
    accept = _audit(
        arun, scripted_server({**teammates, "policy": _critic("Correct.")}), pool_for, "gate", held
    )
    reject = _audit(
        arun, scripted_server({**teammates, "policy": _critic("**Incorrect.**")}), pool_for, "gate", held
    )
    swapped = _audit(
        arun,
        scripted_server({**teammates, "policy": _critic("Incorrect.")}),
        pool_for,
        "gate",
        held,
        swap=True,
    )
    grand = ["policy", *team.TEAMMATES]
    assert accept.loo["policy"] == pytest.approx(0.0)  # accepting everything is the team without its critic
    assert reject.value_of(grand) != accept.value_of(grand)
    # Rejecting in the swapped order hands every answer back to the original slot 1.
    assert swapped.value_of(grand) == pytest.approx(accept.value_of(grand))
    n_sub = sum(e.fields["kind"] == "sub" for e in held)
    n_easy = sum(e.fields["kind"] == "easy" for e in held)
    # Accepting scores slot 1, rejecting slot 2: together 2 on `easy`, 0 on `sub`, 1 on the others.
    assert reject.value_of(grand) + accept.value_of(grand) == pytest.approx(
        1 - n_sub / len(held) + n_easy / len(held)
    )


@pytest.mark.skipif(not (SHIPPED / "rows.jsonl.gz").exists(), reason="no shipped study rows")
@pytest.mark.slow
def test_the_crl_table_is_rebuilt_from_the_shipped_rows_alone(tmp_path: Path) -> None:
    folder = tmp_path / "crl_team"
    shutil.copytree(SHIPPED, folder)
    for made in ("summary.json", "table.md"):
        (folder / made).unlink(missing_ok=True)
    summary, text = report.build(folder, figure=tmp_path / "figure.png")
    assert (tmp_path / "figure.png").stat().st_size > 10_000
    readme = (ROOT / "docs" / "crl.md").read_text()
    start, end = report.MARKERS
    assert readme.split(start, 1)[1].split(end, 1)[0] == "\n" + text
    assert text == (SHIPPED / "table.md").read_text()
    vote = summary["settings"]["vote"]
    manifest = json.loads((folder / "manifest.json").read_text())
    assert vote["n_questions"] == manifest["eval_size"]
    # The shipped questions: none held out is a training question, operand order included.
    train = {
        team.question_key(json.loads(line)["input"]) for line in (folder / "data" / "train.jsonl").open()
    }
    held_out = [json.loads(line)["input"] for line in (folder / "data" / "eval.jsonl").open()]
    assert len(held_out) == vote["n_questions"] and not {team.question_key(q) for q in held_out} & train
    assert len(vote["arms"]["uniform"]["seeds"]) == len(summary["seeds"]) >= 2
    # The shipped rollouts are the trainings' own: the group of each update the trainer logs (its first), each
    # seed's (the share of groups whose rewards are all equal is read from them; SFT's update uses no advantage).
    rollouts = report.read_rollouts(folder)
    for t in report.read_trainings(folder):
        run = (t["setting"], t["arm"], t["seed"])
        mine = [r for r in rollouts if (r["setting"], r["arm"], r["seed"]) == run]
        assert sorted({r["step"] for r in mine}) == list(range(1, manifest["steps"] + 1)), run
        assert len(mine) == manifest["steps"] * manifest["rollouts_per_prompt"], run
    assert set(vote["curves"]["uniform"]["flat_groups"]) and "flat_groups" not in vote["curves"]["sft"]
    # The constants come from the rows: copying a slot scores what the rows say that slot scores.
    rows = [
        r
        for r in report.read_rows(folder)
        if r["eval"] == "audit" and r["arm"] == "before" and r["evaluated_in"] == "vote"
    ]
    assert vote["constants"]["copy slot 1"] == pytest.approx(
        sum(r["slots_right"][0] for r in rows) / len(rows)
    )


def test_the_report_refuses_rows_whose_audit_means_disagree(tmp_path: Path) -> None:
    row = {
        "setting": "vote",
        "evaluated_in": "vote",
        "arm": "before",
        "seed": None,
        "id": "q",
        "kind": "add",
        "score": 1.0,
        "slots": ["85", "95"],
        "slots_right": [True, False],
        "slot_members": ["adder", "multiplier"],
        "coalitions": {
            "policy": 0.0,
            "adder": 1.0,
            "multiplier": 0.0,
            "policy,adder": 1.0,
            "policy,multiplier": 0.0,
            "adder,multiplier": 1.0,
            "policy,adder,multiplier": 1.0,
        },
    }
    rows = [
        {**row, "eval": "audit"},
        {**row, "eval": "swap"},
        {**row, "eval": "report", "shapley": {"policy": 0.5}, "loo": {"policy": 0.0}},
    ]
    with pytest.raises(SystemExit, match="audit's shapley"):
        report.summarise(rows, "adder", {"seeds": [0]})


def test_the_held_out_curve_and_the_plateau_read_checkpoints_and_rollouts_by_seed() -> None:
    def rows(step: int | None, seed: int, scores: list[float]) -> list[dict]:
        meta = {"setting": "vote", "arm": "uniform", "seed": seed, "step": step, "eval": "curve"}
        return [{**meta, "id": f"q{i}", "score": x} for i, x in enumerate(scores)]

    checkpoints = (
        rows(8, 0, [1, 0, 0, 0]) + rows(8, 1, [1, 1, 0, 0]) + rows(8, 2, [1, 1, 1, 1])
    )  # seed 2: no final
    final = {"uniform": {0: [1.0, 1.0, 0.0, 0.0], 1: [1.0, 1.0, 0.0, 0.0]}}
    curve = report.held_out_curve(checkpoints, "vote", [0.0, 0.0, 0.0, 1.0], final, 16)["uniform"]
    assert curve["seeds"] == [0, 1] and curve["updates"] == [0, 8, 16]
    assert [curve["team"][k]["mean"] for k in ("0", "8", "16")] == pytest.approx([0.25, 0.375, 0.5])
    assert curve["last_minus_previous"]["per_seed"] == pytest.approx([0.25, 0.0])
    # Rollout rewards by thirds of the updates, the last third minus the middle one per seed.
    metrics = [
        {"setting": "vote", "arm": "uniform", "seed": s, "step": k, "system_reward": r}
        for s, rewards in ((0, [0, 0, 1, 1, 1, 1]), (1, [0, 1, 0, 1, 1, 0]))
        for k, r in enumerate(rewards, 1)
    ]
    plateau = report.plateau(metrics, "vote", "uniform")
    assert plateau["updates"] == 6 and plateau["thirds"] == pytest.approx([0.25, 0.75, 0.75])
    assert plateau["last_minus_middle"]["per_seed"] == pytest.approx([0.0, 0.0])
    # Groups (one prompt's rollouts in one update) whose rewards are all equal, by thirds, seed means.
    rollouts = [
        {"setting": "vote", "arm": "uniform", "seed": s, "step": k, "example": e, "reward": r}
        for s, steps in (
            (0, [([1, 1], [0, 1]), ([0, 0], [1, 1]), ([0, 1], [0, 1])]),
            (1, [([0, 1], [0, 1]), ([1, 1], [1, 0]), ([1, 1], [0, 0])]),
        )
        for k, groups in enumerate(steps, 1)
        for e, rewards in enumerate(groups)
        for r in rewards
    ]
    assert report.flat_groups(rollouts, "vote", "uniform") == pytest.approx([0.25, 0.75, 0.5])
    assert report.flat_groups(rollouts, "vote", "sft") is None


def test_a_shipped_study_goes_on_elsewhere_without_redoing_a_finished_policy(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """`crl_team.py --resume-from bench/results/crl_team` on a machine without the run folder: the shipped
    rows and trainings are put back byte for byte, and the study's own command then trains and evaluates
    nothing for a seed whose every arm the pack holds (no policy is loaded: its weights are not shipped)."""
    import crl_team

    manifest = json.loads((SHIPPED / "manifest.json").read_text())
    trained = {(t["setting"], t["seed"], t["arm"]) for t in report.read_trainings(SHIPPED)}
    setting, seed = next(
        (s, seed)
        for s in manifest["settings"]
        for seed in manifest["seeds"]
        if all((s, seed, arm) in trained for arm in manifest["arms"] if arm != "before")
    )
    study = tmp_path / "study"
    argv = [
        "crl_team.py", "--out", str(study), "--settings", setting, "--seeds", str(seed),
        "--steps", str(manifest["steps"]), "--eval-size", str(manifest["eval_size"]),
        "--train-size", str(manifest["train_size"]), "--resume-from", str(SHIPPED),
    ]  # fmt: skip
    argv += ["--transfer"] * manifest["transfer"] + ["--bf16"] * manifest.get("bf16", False)
    monkeypatch.setattr(sys, "argv", argv)
    crl_team.main()
    printed = capsys.readouterr().out
    assert '"resumed_from"' in printed and '"trained"' not in printed and '"evaluated"' not in printed
    assert report.read_rows(study) == report.read_rows(SHIPPED)
    # Each restored training's curve, rollouts and summary as shipped (one whose policy's evaluations the pack
    # does not all hold, a seed shipped while it ran, is not restored: it is trained again).
    restored = {(t["setting"], t["arm"], t["seed"]) for t in report.read_trainings(study)}
    assert (setting, "uniform", seed) in restored
    for read in (report.read_curves, report.read_rollouts, report.read_trainings):
        shipped = [t for t in read(SHIPPED) if (t["setting"], t["arm"], t["seed"]) in restored]
        assert read(study) == shipped, read.__name__
    assert all(
        (study / "data" / f).read_bytes() == (SHIPPED / "data" / f).read_bytes()
        for f in ("train.jsonl", "eval.jsonl")
    )
    # The manifest keeps the shipped study's processes and adds this one.
    processes = json.loads((study / "manifest.json").read_text())["processes"]
    assert processes[:-1] == manifest["processes"] and processes[-1]["pid"] == crl_team.PROCESS["pid"]
    # A pack of other questions is refused, naming the file.
    (study / "data" / "eval.jsonl").write_text("{}\n")
    with pytest.raises(SystemExit, match="eval.jsonl: differs from"):
        crl_team.resume_from(SHIPPED, study, manifest["transfer"])


@pytest.mark.slow
def test_a_small_study_runs_end_to_end_and_its_pack_alone_rebuilds_the_table(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The study's own commands on a small run, nothing stubbed: real GRPO updates (TRL) of SmolLM2-135M from the
    offline zoo in the proposer seat, each policy evaluated by the product's audit (all 8 coalitions, the
    position swap), then the report: the rows packed, the table written into a README between its markers, the
    figure drawn. The run folder is then deleted and the pack alone gives the same table."""
    import crl_team

    study, pack = tmp_path / "study", tmp_path / "pack"
    argv = [
        "crl_team.py", "--out", str(study), "--settings", "vote", "--arms", "uniform",
        "--seeds", "0", "1", "--steps", "1", "--prompts", "1", "--eval-size", "4", "--train-size", "8",
        "--save-steps", "1",
    ]  # fmt: skip
    monkeypatch.setattr(sys, "argv", argv)
    crl_team.main()
    printed = capsys.readouterr().out
    assert printed.count('"trained"') == 2 and '"evaluated": "vote-uniform-1"' in printed
    readme = tmp_path / "README.md"
    start, end = report.MARKERS
    readme.write_text(f"# A project\n\n{start}\nold table\n{end}\n\nAfter.\n")
    report.main(
        [str(study), "--pack", str(pack), "--readme", str(readme), "--figure", str(tmp_path / "f.png")]
    )
    block = readme.read_text().split(start, 1)[1].split(end, 1)[0]
    assert "old table" not in block and readme.read_text().endswith(f"{end}\n\nAfter.\n")
    assert "Run: 2 seeds with results (0, 1), 1 update of 1 prompt x 4 rollouts per arm" in block
    assert "**vote** (4 held-out questions never trained on). Constant policies: copy slot 1" in block
    uniform = next(line for line in block.splitlines() if line.startswith("| C-RL, uniform credit | 0,1 |"))
    assert len(uniform.split("|")) == 14 and "| - |" not in uniform  # every column has its value
    assert "| C-RL, uniform credit minus before (untrained) | 2 |" in block
    assert (tmp_path / "f.png").stat().st_size > 10_000
    # The pack holds the rows, the trainings and the manifest with this process's commit; alone, it rebuilds.
    manifest = json.loads((pack / "manifest.json").read_text())
    assert manifest["processes"][-1]["commit"] == crl_team.PROCESS["commit"]
    shutil.rmtree(study)
    _, text = report.build(pack, figure=None)
    assert "\n" + text == block
