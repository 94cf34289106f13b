"""Text-level protocols, run end to end through real HTTP against scripted members.

The scripted members answer by stage and tag their texts (`alice-r2:` = alice's answer in round 2; `bob-k:`
= bob's knowledge; ...), so a test reads from the server's request log exactly who saw what in which round,
and from the outcome what the protocol answered.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import pytest
from typer.testing import CliRunner

import colab_graphs._env  # noqa: F401  (offline settings, before litellm is imported)
from colab_graphs.cli.app import app
from colab_graphs.coalition import restrict
from colab_graphs.models.client import ModelClient
from colab_graphs.pool import Pool
from colab_graphs.protocol_registry import build_protocol, list_protocols
from colab_graphs.protocols.text_structured import pairwise_rank, rank_from_verdicts, topology_edges
from colab_graphs.runner import ExampleOutcome, run_dataset
from colab_graphs.spec import GraphSpec
from colab_graphs.tasks.example import Example
from colab_graphs.testing import ScriptedServer
from colab_graphs.testing.scripts import Messages, Script, last_user_text

TEAM = ["alice", "bob", "carol"]
TEXT_PROTOCOLS = [
    "debate",
    "feedback",
    "mixture_of_agents",
    "knowledge_card",
    "topology",
    "blackboard",
    "llm_blender",
]
_ROUND_TAG = re.compile(r"\b[a-z]+-r(\d+):")
_ANSWER = re.compile(r"The answer is (-?\d+)")


def _rank_by_value(text: str) -> str:
    """Pairwise verdicts preferring the candidate with the larger answer (ties: the earlier one)."""
    values = [int(v) for v in re.findall(r"Response \d+:\n[^\n]*The answer is (-?\d+)", text)]
    return "\n".join(
        f"{i + 1} {'>' if values[i] >= values[j] else '<'} {j + 1}"
        for i in range(len(values))
        for j in range(i + 1, len(values))
    )


def agent(name: str, answers: Sequence[int] = (5,)) -> Script:
    """A member that knows every stage of the text protocols by its default prompt.

    Its answer in round (or layer) k is `answers[k - 1]` (the last one repeats), where k is one more than the
    latest round tag in the prompt. A knowledge answerer answers with how many knowledge paragraphs it saw;
    a fuser with the sum of the answers it was given.
    """

    def script(messages: Messages, params: dict[str, Any]) -> str:
        text = last_user_text(messages)
        if "Compare the responses pairwise" in text:
            return _rank_by_value(text)
        if "Fuse them into one response" in text:
            return f"{name}-fuse: The answer is {sum(int(v) for v in _ANSWER.findall(text))}."
        if "Write a short paragraph of background knowledge" in text:
            return f"{name}-k: a fact known to {name}."
        if "Knowledge from several sources" in text:
            return f"{name}-final: The answer is {len(set(re.findall(r'[a-z]+-k:', text)))}."
        if "Give brief, specific feedback" in text:
            return f"{name}-review: notes from {name}."
        k = 1 + max((int(r) for r in _ROUND_TAG.findall(text)), default=0)
        return f"{name}-r{k}: The answer is {answers[min(k, len(answers)) - 1]}."

    return script


@dataclass
class Played:
    """One example run: the outcome (answer, trace) and every HTTP request the server saw."""

    outcome: ExampleOutcome
    requests: list[Any]

    @property
    def answer(self) -> str | None:
        return self.outcome.output

    def called(self) -> set[str]:
        return {r.model for r in self.requests}

    def prompt(self, seat: str) -> str:
        """The user prompt of the call made for `seat`."""
        calls = [c for c in self.outcome.trace.calls if c.seat == seat]
        assert len(calls) == 1, f"expected one call for seat {seat!r}, got {len(calls)}"
        return last_user_text(calls[0].messages)

    def member_of(self, seat: str) -> str:
        return next(c.member for c in self.outcome.trace.calls if c.seat == seat)

    def all_prompts(self) -> str:
        return "\n".join(last_user_text(r.messages) for r in self.requests)


@pytest.fixture(scope="module")
def loop() -> Iterator[asyncio.AbstractEventLoop]:
    # One loop for the module: litellm's logging worker complains when asyncio.run() changes loops.
    loop = asyncio.new_event_loop()
    yield loop
    loop.close()


@pytest.fixture
def play(loop: asyncio.AbstractEventLoop):
    def run(spec: GraphSpec | None, scripts: dict[str, Script] | None = None) -> Played:
        assert spec is not None
        scripts = scripts or {m: agent(m) for m in TEAM}
        with ScriptedServer(scripts) as server:
            pool = Pool.from_dict({m: server.litellm_kwargs(m) for m in scripts})
            client = ModelClient(None, retries=0, backoff_s=0.01, timeout_s=10)
            example = Example(id="q1", input="What is 2 + 3?", answer="5")
            outcomes, _ = loop.run_until_complete(run_dataset(spec, pool, [example], client=client))
            requests = server.requests
        assert not outcomes[0].failed, outcomes[0].error
        return Played(outcomes[0], requests)

    return run


def section(prompt: str, start: str, end: str | None = None) -> str:
    """The part of `prompt` after `start` (and before `end`)."""
    assert start in prompt, f"{start!r} not in prompt:\n{prompt}"
    rest = prompt.split(start, 1)[1]
    return rest.split(end, 1)[0] if end else rest


# Debate


@pytest.mark.integration
def test_debate_second_round_shows_every_first_round_answer_and_the_members_own(play):
    played = play(build_protocol("debate", TEAM))
    prompt = played.prompt("r2_bob")
    previous = section(prompt, "previous round", "Your previous answer")
    assert all(f"{m}-r1:" in previous for m in TEAM)
    assert section(prompt, "Your previous answer was:").strip().startswith("bob-r1:")


@pytest.mark.integration
def test_debate_votes_over_the_last_round_not_the_first(play):
    scripts = {"alice": agent("alice", [4, 5]), "bob": agent("bob", [4, 5]), "carol": agent("carol", [5, 4])}
    played = play(build_protocol("debate", TEAM), scripts)
    assert played.answer == "5"  # round 1 voted 4, round 2 votes 5


@pytest.mark.integration
def test_debate_third_round_sees_the_second_round_only(play):
    played = play(build_protocol("debate", TEAM, rounds=3))
    prompt = played.prompt("r3_alice")
    assert all(f"{m}-r2:" in prompt for m in TEAM)
    assert "-r1:" not in prompt
    assert len(played.requests) == 9


# Feedback


@pytest.mark.integration
def test_feedback_reviewers_see_every_answer(play):
    played = play(build_protocol("feedback", TEAM))
    for reviewer in TEAM:
        assert all(f"{m}-r1:" in played.prompt(f"review1_{reviewer}") for m in TEAM)


@pytest.mark.integration
def test_feedback_revision_sees_its_answer_all_answers_and_all_reviews(play):
    played = play(build_protocol("feedback", TEAM))
    prompt = played.prompt("revise1_carol")
    assert section(prompt, "Your answer was:", "All answers").strip().startswith("carol-r1:")
    assert all(f"{m}-r1:" in section(prompt, "All answers", "Feedback") for m in TEAM)
    assert all(f"{m}-review:" in section(prompt, "Feedback from the reviewers") for m in TEAM)


@pytest.mark.integration
def test_feedback_votes_over_the_revisions(play):
    scripts = {"alice": agent("alice", [4, 5]), "bob": agent("bob", [4, 5]), "carol": agent("carol", [5, 4])}
    played = play(build_protocol("feedback", TEAM), scripts)
    assert played.answer == "5"
    assert len(played.requests) == 9  # answer, review, revise per member


# Mixture of agents


@pytest.mark.integration
def test_mixture_of_agents_layer_two_sees_layer_one_and_aggregator_sees_layer_two(play):
    played = play(build_protocol("mixture_of_agents", TEAM))
    assert all(f"{m}-r1:" in played.prompt("l2_bob") for m in TEAM)
    aggregate = played.prompt("aggregate")
    assert all(f"{m}-r2:" in aggregate for m in TEAM) and "-r1:" not in aggregate


@pytest.mark.integration
def test_mixture_of_agents_answer_is_the_aggregators(play):
    scripts = {m: agent(m, [1, 1, 7]) for m in TEAM}  # only the aggregator (layer 3) says 7
    played = play(build_protocol("mixture_of_agents", TEAM, aggregator="carol"), scripts)
    assert played.member_of("aggregate") == "carol"
    assert played.answer == "7"


@pytest.mark.integration
def test_mixture_of_agents_absent_aggregator_is_replaced_by_the_first_present_member(play):
    spec = build_protocol("mixture_of_agents", TEAM, aggregator="bob")
    played = play(restrict(spec, ["alice", "carol"]))
    assert played.member_of("aggregate") == "alice"


# Knowledge card


@pytest.mark.integration
def test_knowledge_card_answerer_reads_every_members_knowledge(play):
    played = play(build_protocol("knowledge_card", TEAM))
    assert all(f"{m}-k:" in played.prompt("answer") for m in TEAM)
    assert played.answer == "3"  # the answerer reports three knowledge paragraphs


@pytest.mark.integration
def test_knowledge_card_absent_member_contributes_no_knowledge(play):
    played = play(restrict(build_protocol("knowledge_card", TEAM), ["alice", "carol"]))
    assert "bob-k:" not in played.prompt("answer")
    assert played.answer == "2"


@pytest.mark.integration
def test_knowledge_card_absent_answerer_is_replaced_by_the_first_present_member(play):
    spec = build_protocol("knowledge_card", TEAM, answerer="carol")
    played = play(restrict(spec, ["alice", "bob"]))
    assert played.member_of("answer") == "alice"


# Topology


def test_named_topologies_have_the_documented_edges():
    assert topology_edges("chain", 3) == [(0, 1), (1, 2)]
    assert topology_edges("ring", 3) == [(0, 1), (1, 2), (2, 0)]
    assert topology_edges("star", 3) == [(0, 1), (0, 2), (1, 0), (2, 0)]
    assert topology_edges("tree", 4) == [(0, 1), (0, 2), (1, 0), (1, 3), (2, 0), (3, 1)]
    assert len(topology_edges("complete", 4)) == 12


def test_adjacency_matrix_replaces_the_topology_and_ignores_the_diagonal():
    assert topology_edges("complete", 2, [[1, 1], [0, 1]]) == [(0, 1)]


@pytest.mark.parametrize(
    ("matrix", "message"),
    [
        ([[0, 1]], "must have 3 rows"),
        ([[0, 1, 0], [0, 0], [0, 0, 0]], "row 1"),
        ([[0, 1, 0], [0, 0, 2], [0, 0, 0]], r"adjacency\[1\]\[2\]"),
    ],
)
def test_bad_adjacency_is_an_error_naming_the_row_or_cell(matrix, message):
    with pytest.raises(ValueError, match=message):
        build_protocol("topology", TEAM, adjacency=matrix)


def test_unknown_topology_is_an_error_listing_the_choices():
    with pytest.raises(ValueError, match="chain, ring, star, tree, complete"):
        build_protocol("topology", TEAM, topology="mesh")


@pytest.mark.integration
def test_topology_chain_member_hears_only_its_predecessor(play):
    played = play(build_protocol("topology", TEAM, topology="chain"))
    bob = section(played.prompt("r2_bob"), "connected to you:", "Consider")
    assert "alice-r1:" in bob and "carol-r1:" not in bob
    assert section(played.prompt("r2_alice"), "connected to you:", "Consider").strip() == "(none)"


@pytest.mark.integration
def test_topology_star_centre_hears_everyone_and_leaves_hear_the_centre(play):
    played = play(build_protocol("topology", TEAM, topology="star"))
    centre = section(played.prompt("r2_alice"), "connected to you:", "Consider")
    leaf = section(played.prompt("r2_carol"), "connected to you:", "Consider")
    assert "bob-r1:" in centre and "carol-r1:" in centre
    assert "alice-r1:" in leaf and "bob-r1:" not in leaf


@pytest.mark.integration
def test_topology_adjacency_from_the_command_line_json(play):
    spec = build_protocol("topology", TEAM, adjacency="[[0,0,1],[0,0,0],[0,1,0]]")  # a->c, c->b
    played = play(spec)
    assert "carol-r1:" in section(played.prompt("r2_bob"), "connected to you:", "Consider")
    assert "alice-r1:" in section(played.prompt("r2_carol"), "connected to you:", "Consider")
    assert section(played.prompt("r2_alice"), "connected to you:", "Consider").strip() == "(none)"


@pytest.mark.integration
def test_topology_labels_keep_pool_positions_when_a_member_is_absent(play):
    played = play(restrict(build_protocol("topology", TEAM), ["alice", "carol"]))
    neighbours = section(played.prompt("r2_carol"), "connected to you:", "Consider")
    assert "Agent 1:\nalice-r1:" in neighbours and "Agent 2" not in neighbours


@pytest.mark.integration
def test_topology_votes_over_the_last_round(play):
    scripts = {"alice": agent("alice", [4, 5]), "bob": agent("bob", [4, 5]), "carol": agent("carol", [5, 4])}
    assert play(build_protocol("topology", TEAM, topology="ring"), scripts).answer == "5"


# Blackboard


@pytest.mark.integration
def test_blackboard_round_one_sees_an_empty_board_and_round_two_every_post(play):
    played = play(build_protocol("blackboard", TEAM))
    assert "(none)" in played.prompt("post_r1_bob")
    assert all(f"{m}-r1:" in played.prompt("post_r2_bob") for m in TEAM)


@pytest.mark.integration
def test_blackboard_decider_reads_the_whole_board_and_gives_the_answer(play):
    scripts = {m: agent(m, [1, 2, 8]) for m in TEAM}
    played = play(build_protocol("blackboard", TEAM, decider="bob"), scripts)
    board = played.prompt("decide")
    assert all(f"{m}-r{r}:" in board for m in TEAM for r in (1, 2))
    assert played.member_of("decide") == "bob"
    assert played.answer == "8"


@pytest.mark.integration
def test_blackboard_final_vote_counts_the_last_round_posts(play):
    scripts = {"alice": agent("alice", [4, 6]), "bob": agent("bob", [4, 6]), "carol": agent("carol", [4, 4])}
    played = play(build_protocol("blackboard", TEAM, final="vote"), scripts)
    assert played.answer == "6"
    assert len(played.requests) == 6


# LLM-Blender


def test_rank_counts_first_verdict_per_pair_and_breaks_ties_by_pool_order():
    assert rank_from_verdicts(3, "Response 2 > Response 1\n3 > 2\n1 > 3\n2 < 3\n9 > 1\n1 > 1") == [0, 1, 2]
    assert rank_from_verdicts(3, "2 > 1\n2 > 3\n1 < 3") == [1, 2, 0]
    assert rank_from_verdicts(2, "no verdicts at all") == [0, 1]


def test_pairwise_rank_returns_one_candidate_verbatim_and_several_numbered_best_first():
    inputs = {"candidates": ["x", "y", "z"], "verdicts": "1 < 3\n2 < 3\n1 > 2"}
    assert pairwise_rank(inputs, top_k=1) == "z"
    assert pairwise_rank(inputs, top_k=2) == "Candidate 1:\nz\n\nCandidate 2:\nx"


@pytest.mark.integration
def test_blender_ranker_sees_all_candidates_and_fuser_gets_the_top_two_best_first(play):
    scripts = {"alice": agent("alice", [3]), "bob": agent("bob", [9]), "carol": agent("carol", [5])}
    played = play(build_protocol("llm_blender", TEAM), scripts)
    assert all(f"{m}-r1:" in played.prompt("rank") for m in TEAM)
    fuse = played.prompt("fuse")
    assert fuse.index("bob-r1:") < fuse.index("carol-r1:") and "alice-r1:" not in fuse
    assert played.answer == "14"  # the fuser sums the answers it was given: 9 + 5


@pytest.mark.integration
def test_blender_with_top_one_answers_with_the_best_candidate_without_fusing(play):
    scripts = {"alice": agent("alice", [3]), "bob": agent("bob", [9]), "carol": agent("carol", [5])}
    played = play(build_protocol("llm_blender", TEAM, top_k=1), scripts)
    assert played.answer == "9"
    assert len(played.requests) == 4  # three candidates and one ranking


@pytest.mark.integration
def test_blender_with_one_member_left_answers_with_its_candidate_in_one_call(play):
    played = play(restrict(build_protocol("llm_blender", TEAM), ["carol"]))
    assert played.answer == "5"
    assert len(played.requests) == 1


@pytest.mark.integration
def test_blender_absent_ranker_and_fuser_are_replaced_by_the_first_present_member(play):
    spec = build_protocol("llm_blender", TEAM, ranker="alice", fuser="alice")
    played = play(restrict(spec, ["bob", "carol"]))
    assert played.member_of("rank") == "bob" and played.member_of("fuse") == "bob"


# Coalitions of every protocol


@pytest.mark.integration
@pytest.mark.parametrize("absent", TEAM)
@pytest.mark.parametrize("name", TEXT_PROTOCOLS)
def test_removed_member_is_never_called_and_its_texts_reach_nobody(play, name, absent):
    present = [m for m in TEAM if m != absent]
    played = play(restrict(build_protocol(name, TEAM), present))
    assert played.called() == set(present)
    assert f"{absent}-" not in played.all_prompts()
    assert played.answer


@pytest.mark.integration
@pytest.mark.parametrize("name", TEXT_PROTOCOLS)
def test_single_member_coalition_runs_on_that_member_alone(play, name):
    played = play(restrict(build_protocol(name, TEAM), ["bob"]))
    assert played.called() == {"bob"}
    assert played.answer == ("1" if name == "knowledge_card" else "5")


@pytest.mark.parametrize("name", TEXT_PROTOCOLS)
def test_empty_coalition_has_no_graph(name):
    assert restrict(build_protocol(name, TEAM), []) is None


# Registry and CLI


def test_every_text_protocol_is_listed_with_its_family_and_parameter_docs():
    infos = {p.name: p for p in list_protocols()}
    for name in TEXT_PROTOCOLS:
        assert infos[name].family == "text"
        assert infos[name].min_members >= 1
        assert set(infos[name].param_docs) == set(infos[name].params), name


@pytest.mark.parametrize("name", TEXT_PROTOCOLS)
def test_show_draws_the_protocol(name):
    result = CliRunner().invoke(app, ["show", name, "--format", "mermaid"])
    assert result.exit_code == 0, result.output
    assert result.output.startswith("flowchart TD") and "[m3]" in result.output


def test_show_takes_parameters_as_json_from_the_command_line():
    matrix = json.dumps([[0, 1, 0], [0, 0, 1], [0, 0, 0]])
    result = CliRunner().invoke(app, ["show", "topology", "-P", f"adjacency={matrix}", "--format", "json"])
    assert result.exit_code == 0, result.output
    inboxes = {n["name"]: n["reads"] for n in json.loads(result.output)["nodes"] if n.get("fn") == "inbox"}
    assert inboxes["inbox_r2_m3"] == {"Agent 2": "topology:r1:m2?"}


def test_unknown_member_parameter_is_an_error_naming_it():
    with pytest.raises(ValueError, match="aggregator='zed' is not a member"):
        build_protocol("mixture_of_agents", TEAM, aggregator="zed")
