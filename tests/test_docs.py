"""README and docs/ as a newcomer reads them: every link and anchor resolves, the docs index lists every page,
and README's first audit of your own models runs as written, making the calls it says."""

from __future__ import annotations

import json
import re
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
    for secret in ("sk-readme-openai-key", "sk-readme-anthropic-key"):
        assert secret not in (tmp_path / "audits" / "first" / "report.json").read_text() + done.stdout
