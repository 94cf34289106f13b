"""The game computed from the members' answers equals the game played coalition by coalition.

A protocol that declares independent replies (majority_vote, slm_mux) is audited by playing only the
leave-one-out coalitions and computing every other coalition's value from the grand coalition's replies.
These tests pin that the computed values are the played ones (over real HTTP, on MoCo records, with replies
in real models' styles, abstentions, equivalent answers written differently and ties), that the vectorised
vote is `TaskView.vote` for every coalition, and that an exact audit then costs the calls of leave-one-out.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from realistic_team import records, team

from colab_graphs.audit.answers import answer_classes, answers_kind, game_from_answers, vote_values
from colab_graphs.audit.run import play_audit
from colab_graphs.models.cache import CallCache
from colab_graphs.models.client import ModelClient
from colab_graphs.protocol_registry import build_protocol
from colab_graphs.tasks.example import Example
from colab_graphs.tasks.scoring import view_for
from colab_graphs.tasks.task_types import NumericTask, TaskView

MEMBERS = ["m1", "m2", "m3", "m4"]
NUMERIC = Example(id="q", input="How many?", answer="3")
REPLIES = [
    "The answer is 3.",
    "#### 3.0",
    "The answer is 4.",
    "\\boxed{4}",
    "I am not sure.",
    "The answer is 5.",
]


def brute_force(replies: list[str], seat_member: list[int], n: int, view) -> list[float]:
    """Every coalition's value by `TaskView.vote` over its seats' replies, scored as a run scores it."""
    out = []
    for mask in range(1 << n):
        if mask == 0:
            out.append(0.0)
            continue
        chosen = [r for r, m in zip(replies, seat_member, strict=True) if mask >> m & 1]
        out.append(view.task.score(view.vote(chosen), view.example).value)
    return out


@settings(max_examples=60, deadline=None)
@given(st.integers(2, 5), st.integers(1, 2), st.data())
def test_the_vectorised_vote_is_the_task_vote_for_every_coalition(n, samples, data):
    replies = [data.draw(st.sampled_from(REPLIES)) for _ in range(n * samples)]
    seat_member = [m for m in range(n) for _ in range(samples)]
    view = view_for(NUMERIC)
    classes, answers, consistent = answer_classes(replies, view)
    assert consistent
    scores = np.array([view.task.score(a, NUMERIC).value if a else 0.0 for a in answers])
    values = vote_values(classes, np.array(seat_member), n, scores, view.task.score("", NUMERIC).value, 0.0)
    assert values.tolist() == brute_force(replies, seat_member, n, view)


class CloseNumbers(NumericTask):
    """Numbers within 1 are "the same": 3 ~ 4 and 4 ~ 5 but not 3 ~ 5, as a tolerance-based `same` could say."""

    def same(self, a: str, b: str, example: Example) -> bool:
        return abs(float(a) - float(b)) <= 1.0


def test_answer_classes_say_when_the_task_s_same_is_not_an_equivalence():
    view = TaskView(CloseNumbers(), NUMERIC)
    _, _, consistent = answer_classes(["The answer is 3.", "The answer is 4.", "The answer is 5."], view)
    assert not consistent


def test_a_vote_whose_same_is_not_an_equivalence_is_computed_coalition_by_coalition(arun):
    spec = build_protocol("majority_vote", ["a", "b", "c"])
    view = TaskView(CloseNumbers(), NUMERIC)
    replies = ["The answer is 4.", "The answer is 3.", "The answer is 5."]
    values = arun(game_from_answers(spec, "vote", replies, view, 0.0))
    assert values.tolist() == brute_force(replies, [0, 1, 2], 3, view)


def test_the_declaration_and_the_spec_decide_whether_answers_suffice():
    assert answers_kind(build_protocol("majority_vote", MEMBERS)) == "vote"
    assert answers_kind(build_protocol("slm_mux", MEMBERS)) == "aggregate"
    assert answers_kind(build_protocol("debate", MEMBERS)) is None  # later rounds read the first
    assert answers_kind(build_protocol("prompt_routing", MEMBERS)) is None  # not declared, and routed
    renamed = build_protocol("majority_vote", MEMBERS).model_copy(update={"name": "my_vote"})
    assert answers_kind(renamed) is None  # no declaration: played coalition by coalition


# --- over real HTTP ----------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def examples():
    return records(limit=4)


@pytest.fixture
def team_pool(scripted_server, pool_for, examples):
    def make(names, **settings):
        server = scripted_server(team(examples, names))
        return server, pool_for(server, names, **settings)

    return make


def audit(arun, spec, pool, examples, cache: CallCache, **options):
    client = ModelClient(cache, max_concurrency=8, backoff_s=0.01)
    return arun(play_audit(spec, pool, examples, client=client, **options))


def values_of(report) -> dict[tuple[str, ...], float]:
    return {tuple(c.members): c.value for c in report.coalitions}


@pytest.mark.parametrize(
    ("protocol", "params"),
    [("majority_vote", {}), ("majority_vote", {"samples": 2}), ("slm_mux", {"samples_per_model": 3})],
)
def test_values_from_answers_equal_playing_every_coalition(
    arun, team_pool, examples, tmp_path, protocol, params
):
    server, pool = team_pool(MEMBERS, seed=11, temperature=0.7)
    spec = build_protocol(protocol, MEMBERS, **params)
    computed = audit(arun, spec, pool, examples, CallCache(tmp_path / "a"), method="exact")
    assert computed.shapley_estimator == "exact_from_answers"
    played = audit(
        arun, spec, pool, examples, CallCache(tmp_path / "b"), method="exact", play_every_coalition=True
    )
    assert played.shapley_estimator == "exact" and len(played.coalitions) == 2 ** len(MEMBERS)
    assert values_of(computed) == pytest.approx(values_of(played), abs=1e-12)
    assert computed.shapley == pytest.approx(played.shapley, abs=1e-12)
    assert computed.individual == pytest.approx(played.individual)
    # Both make exactly the distinct requests; computing from answers makes no more.
    assert computed.calls.made == computed.calls.unique == played.calls.unique
    assert len({v for v in values_of(computed).values()}) > 3  # the game is not trivial


def test_a_leave_one_out_vote_audit_gives_exact_shapley_at_the_calls_of_leave_one_out(
    arun, team_pool, examples, tmp_path
):
    server, pool = team_pool(MEMBERS)
    spec = build_protocol("majority_vote", MEMBERS)
    report = audit(arun, spec, pool, examples, CallCache(tmp_path / "c"), method="loo")
    assert report.method == "loo" and report.shapley_method == "exact"
    assert report.shapley_estimator == "exact_from_answers" and report.sampling_error is None
    assert len(report.coalitions) == 2 ** len(MEMBERS)
    # One request per member and record (the solo runs ask the same), each sent once.
    assert report.calls.unique == len(MEMBERS) * len(examples)
    assert set(server.request_counts().values()) == {1}
    grand, empty = report.value_of(MEMBERS), report.value_of([])
    assert sum(report.shapley.values()) == pytest.approx(grand - empty)


def test_thirteen_members_get_exact_shapley_without_force(arun, team_pool, examples, tmp_path):
    names = [f"m{i}" for i in range(13)]
    server, pool = team_pool(names)
    report = audit(arun, build_protocol("majority_vote", names), pool, examples[:3], CallCache(tmp_path / "d"),
                   method="exact", individual=False)  # fmt: skip
    assert report.shapley_method == "exact" and report.coalitions_valued == 2**13
    assert len(report.coalitions) == len(names) + 1  # the played ones; the others are computed
    assert sum(report.shapley.values()) == pytest.approx(report.value_of(names))
    assert report.calls.unique == len(names) * 3
