"""README and docs/ as a newcomer reads them: every link and anchor resolves, the docs index lists every page,
README's first audit of your own models runs as written, making the calls it says, and every figure the pages
print is what the shipped files give (bench/doc_figures.py)."""

from __future__ import annotations

import json
import re
import shutil
import sys
from pathlib import Path

import pytest
import yaml
from conftest import cli_in_process

from colab_graphs.testing import Member

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")


def outside_fences(text: str) -> str:
    return re.sub(r"^```.*?^```", "", text, flags=re.DOTALL | re.MULTILINE)


def anchors(page: Path) -> set[str]:
    """GitHub's anchors of a page's headings: lower case, punctuation dropped, spaces as hyphens."""
    headings = re.findall(r"^#{1,6} (.+)$", outside_fences(page.read_text()), re.MULTILINE)
    return {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-") for h in headings}


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_and_anchor_resolves(page: Path) -> None:
    broken = []
    for target in LINK.findall(outside_fences(page.read_text())):
        if re.match(r"[a-z]+:", target):
            continue  # a web address
        path, _, anchor = target.partition("#")
        linked = (page.parent / path).resolve() if path else page
        if not linked.exists():
            broken.append(f"{target}: no such file")
        elif anchor and linked.suffix == ".md" and anchor not in anchors(linked):
            broken.append(f"{target}: no heading with that anchor in {linked.relative_to(ROOT)}")
    assert not broken, f"{page.relative_to(ROOT)}: " + "; ".join(broken)


def test_the_docs_index_and_the_readme_reach_every_page() -> None:
    index = (ROOT / "docs" / "README.md").read_text()
    for page in (ROOT / "docs").glob("*.md"):
        if page.name != "README.md":
            assert f"]({page.name})" in index, f"docs/README.md does not list {page.name}"
    assert "](docs/README.md)" in (ROOT / "README.md").read_text()


def test_the_readme_is_read_in_five_minutes() -> None:
    words = len((ROOT / "README.md").read_text().split())
    assert words < 1500, f"README.md has {words} words; move details to docs/"  # ~250 words a minute


# --- README's first audit of your own models -----------------------------------------------------------------

REPLIES = {  # what each member says to each question: prose around the answer, as models write; right and wrong
    "gpt": {
        "train": "From 9:40 to 11:15 is 1 hour 35 minutes.\n\nThe answer is 95.",
        "hens": "17 * 3 = 51. The answer is 51.",
        "Pens": "6 pens cost $7.50, and $10 - $7.50 = $2.50.\n\nThe answer is 2.5.",
    },
    "claude": {
        "train": "The trip takes **95** minutes.\n\nThe answer is 95.",
        "hens": "Each day: 17 x 3 = 51 eggs. The answer is 51.",
        "Pens": "6 x $1.25 = $6.50, so the change is $3.50. The answer is 3.5.",
    },
    "qwen": {
        "train": "11:15 - 9:40 = 1:75, so 75 minutes. The answer is 75.",
        "hens": r"$17 \times 3 = \boxed{51}$",
        "Pens": r"The change is \boxed{2.75}.",
    },
}


def member(name: str) -> Member:
    def script(messages: list[dict], params: dict) -> str:
        question = messages[-1]["content"]
        return next(reply for key, reply in REPLIES[name].items() if key in question)

    return Member(script)


def readme_section(title: str) -> str:
    return (ROOT / "README.md").read_text().split(f"## {title}\n", 1)[1].split("\n## ", 1)[0]


@pytest.mark.integration
def test_the_readme_first_audit_runs_as_written(scripted_server, tmp_path, monkeypatch) -> None:
    """README's pool file, dataset and commands, as written, but for where the members are: the test has no API
    keys, so each member is served by a scripted model over real HTTP (its `model` and `api_base` pointed
    there; every other setting, `${ENV}` keys included, is README's)."""
    section = readme_section("A first audit of your own models")
    pool_text = re.search(r"```yaml\n(.*?)```", section, re.DOTALL)[1]
    data_text = re.search(r"```jsonl\n(.*?)```", section, re.DOTALL)[1]
    commands = re.search(r"```bash\n(.*?)```", section, re.DOTALL)[1].strip().splitlines()
    server = scripted_server({name: member(name) for name in REPLIES})
    pool = yaml.safe_load(pool_text)
    assert list(pool["models"]) == list(REPLIES)
    for name, settings in pool["models"].items():
        settings.update(model=f"openai/{name}", api_base=server.base_url)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("COLAB_GRAPHS_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("OPENAI_API_KEY", "sk-readme-openai-key")
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-readme-anthropic-key")
    (tmp_path / "pool.yaml").write_text(yaml.safe_dump(pool, sort_keys=False))
    (tmp_path / "data.jsonl").write_text(data_text)

    dry_run, audit, view = (line.split()[1:] for line in commands)
    assert "--dry-run" in dry_run and view == ["view", "audits/first"]
    planned = cli_in_process(*dry_run)
    assert planned.returncode == 0, planned.stdout + planned.stderr
    plan = json.loads((tmp_path / "audits" / "first" / "plan.json").read_text())
    assert server.chat_requests == []  # the plan makes no call
    done = cli_in_process(*audit)
    assert done.returncode == 0, done.stdout + done.stderr

    # One call per member and question, as README says (here 9), each sent once.
    asked = sorted((r.model, r.messages[-1]["content"].split("?")[0][-12:]) for r in server.chat_requests)
    assert len(asked) == 9 == len(set(asked))
    report = json.loads((tmp_path / "audits" / "first" / "report.json").read_text())
    assert report["calls"]["made"] == 9 and report["calls"]["failed"] == 0
    assert plan["calls"] == 9 and plan["cached"] == 0  # the plan counted them before any call
    # The game by hand: gpt is right on all three, claude on two (its change is wrong), qwen on the eggs only;
    # the vote's ties go to pool order. v(gpt, .) = 1, v(claude) = v(claude, qwen) = 2/3, v(qwen) = 1/3.
    assert report["individual"] == pytest.approx({"gpt": 1.0, "claude": 2 / 3, "qwen": 1 / 3})
    assert report["loo"] == pytest.approx({"gpt": 1 / 3, "claude": 0.0, "qwen": 0.0})
    assert report["shapley"] == pytest.approx({"gpt": 11 / 18, "claude": 5 / 18, "qwen": 2 / 18})
    # What README says the audit prints and writes.
    assert "Shapley" in done.stdout and "calls made 9" in done.stdout
    written = {p.name for p in (tmp_path / "audits" / "first").iterdir()}
    assert {"report.json", "report.md", "contributions.png", "individual_vs_compositional.png"} <= written
    for secret in ("sk-readme-openai-key", "sk-readme-anthropic-key"):
        assert secret not in (tmp_path / "audits" / "first" / "report.json").read_text() + done.stdout


# --- printed figures: the shipped files' own ------------------------------------------------------------------


def doc_figures():
    sys.path.insert(0, str(ROOT / "bench"))
    try:
        import doc_figures
    finally:
        sys.path.remove(str(ROOT / "bench"))
    return doc_figures


def test_the_printed_figures_are_what_the_shipped_files_give() -> None:
    """README's default-audit timing and values and docs/studies.md's mini-study table, regenerated from
    bench/results/ by bench/doc_figures.py: any number typed or left stale in a page fails here."""
    figures = doc_figures()
    assert figures.main(["--check"]) == 0, figures.stale(ROOT)
    for name, (_page, text) in figures.written(ROOT).items():
        assert text.strip() and any(ch.isdigit() for ch in text), name  # a block that says something
    # What docs/studies.md's prose reads from the shipped study: no setting lacks a significant correlation, no
    # member or coalition passes a HumanEval test, and without HumanEval most settings are not significant.
    study = json.loads((ROOT / "bench" / "results" / "study_mini" / "study.json").read_text())
    assert all(c["significant"] for c in study["correlations"] if c["family"] != "all")
    humaneval = [s for s in study["settings"] if s["dataset"] == "humaneval"]
    assert humaneval and all(
        set(s["individual"].values()) | set(s["shapley"].values()) == {0.0} for s in humaneval
    )
    without = figures.written(ROOT)["study-mini"][1].split("- without humaneval:")[1]
    assert int(re.search(r"; (\d) of 4 not significant", without)[1]) > 2


def test_a_figure_edited_by_hand_is_named_and_rewritten(tmp_path: Path) -> None:
    figures = doc_figures()
    for part in ("README.md", "docs/studies.md", "bench/results/default_audit", "bench/results/study_mini"):
        source, copy = ROOT / part, tmp_path / part
        copy.parent.mkdir(parents=True, exist_ok=True)
        (shutil.copytree if source.is_dir() else shutil.copyfile)(source, copy)
    readme = tmp_path / "README.md"
    block = figures.block_in(readme.read_text(), "default-audit-table", "README.md")
    edited = re.sub(r"v\(all\) = [0-9.]+", "v(all) = 0.999", block)
    assert edited != block
    readme.write_text(readme.read_text().replace(block, edited))
    assert figures.stale(tmp_path) == ["README.md: default-audit-table"]
    assert figures.main(["--root", str(tmp_path)]) == 0
    assert figures.stale(tmp_path) == [] and readme.read_text() == (ROOT / "README.md").read_text()


# --- every command line the pages show names real commands and options -------------------------------------


def command_lines() -> list[tuple[str, str]]:
    """(page, command) for each `colab-graphs ...` line of a bash block in README.md and docs/ (chains split)."""
    found = []
    for page in PAGES:
        for block in re.findall(r"```bash\n(.*?)```", page.read_text(), re.DOTALL):
            for line in block.replace("\\\n", " ").splitlines():
                for part in line.split("&&"):
                    command = part.split(" #")[0].strip()
                    if command.startswith("colab-graphs "):
                        found.append((str(page.relative_to(ROOT)), command))
    return found


def test_every_command_line_shown_names_real_commands_and_options() -> None:
    import typer

    from colab_graphs.cli.app import _register_optional_commands, app

    _register_optional_commands()
    root = typer.main.get_command(app)
    lines = command_lines()
    assert len(lines) > 30
    wrong = []
    for page, line in lines:
        words = [w.strip("[]|") for w in line.split()[1:]]
        command = root
        while hasattr(command, "get_command") and words and not words[0].startswith("-"):
            sub = command.get_command(typer.Context(command), words[0])
            if sub is None:
                wrong.append(f"{page}: {line}: no command {words[0]!r}")
                break
            command, words = sub, words[1:]
        known = {opt for p in command.params for opt in (*p.opts, *p.secondary_opts)} | {"--help"}
        wrong += [
            f"{page}: {line}: {command.name} has no option {w.split('=')[0]}"
            for w in words
            if w.startswith("-") and w != "-" and w.split("=")[0] not in known
        ]
    assert not wrong, "\n".join(wrong)
