"""The one registry: a name belongs to one source, so no plugin silently replaces another's entry."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from colab_graphs.cli.app import app
from colab_graphs.protocol_registry import build_protocol, get_protocol
from colab_graphs.registry import NameClash, aggregator, registry_lookup
from colab_graphs.resolve import load_module
from colab_graphs.tasks.scoring import register_scorer


def graph_file(path: Path, name: str, function: str) -> Path:
    """A user's graph file registering a one-seat protocol `name`, built by `function`."""
    path.write_text(
        "from colab_graphs import GraphBuilder, protocol\n\n"
        f"@protocol({name!r}, family='basic', description='a one-seat protocol')\n"
        f"def {function}(members, prompt: str = '{{input}}'):\n"
        f"    b = GraphBuilder({name!r}, members=members)\n"
        "    b.seat('only', member=members[0], prompt=prompt, writes='answer')\n"
        "    return b.chain('only').output('answer').build()\n"
    )
    return path


def test_registering_a_built_in_name_again_is_an_error_naming_both_sources():
    with pytest.raises(NameClash) as raised:

        @aggregator("vote")
        def my_vote(inputs, *, task, **params):
            return "mine"

    message = str(raised.value)
    assert "aggregator 'vote'" in message
    assert "colab_graphs.aggregators." in message and f"{__name__}." in message


def test_a_scorer_under_a_built_in_tasks_name_is_an_error_naming_the_task_and_the_function():
    registry_lookup("task", "numeric")  # task types (scorers) come with the built-in plugin

    with pytest.raises(NameClash) as raised:

        @register_scorer("numeric")
        def my_numeric(output, example):
            return 1.0

    message = str(raised.value)
    assert "scorer 'numeric'" in message
    assert "colab_graphs.tasks.task_types.NumericTask" in message and f"{__name__}." in message


def test_the_task_kind_stores_task_types_and_the_old_kind_name_still_works_with_a_warning():
    from colab_graphs.registry import registry_names
    from colab_graphs.tasks.task_types import TaskType

    assert isinstance(registry_lookup("task", "numeric").obj, TaskType)
    with pytest.warns(DeprecationWarning, match="registry kind 'scorer' is now 'task'"):
        old = registry_lookup("scorer", "numeric")
    assert old is registry_lookup("task", "numeric") and old.kind == "task"
    with pytest.warns(DeprecationWarning):
        assert registry_names("scorer") == registry_names("task")


def test_a_refused_registration_leaves_the_earlier_entry_in_place():
    with pytest.raises(NameClash):

        @aggregator("vote")
        def my_vote(inputs, *, task, **params):
            return "mine"

    assert registry_lookup("aggregator", "vote").obj.__module__ == "colab_graphs.aggregators"


def test_a_graph_file_loaded_twice_replaces_its_own_registration(tmp_path: Path):
    path = graph_file(tmp_path / "twice.py", "registered_twice_by_one_file", "twice")
    load_module(str(path))
    load_module(str(path))
    assert get_protocol("registered_twice_by_one_file").source.endswith("twice")


def test_the_cli_names_both_sources_of_a_clashing_protocol(tmp_path: Path):
    path = graph_file(tmp_path / "clash.py", "majority_vote", "my_vote")
    result = CliRunner().invoke(app, ["show", "--graph", f"{path}:my_vote"])
    assert result.exit_code != 0
    assert "protocol 'majority_vote' is registered twice" in result.output
    assert "colab_graphs.protocols.basic.majority_vote" in result.output
    assert "colab_graphs_user_clash.my_vote" in result.output
    assert get_protocol("majority_vote").source == "colab_graphs.protocols.basic.majority_vote"


def test_a_plugin_that_takes_a_registered_name_fails_to_load_naming_itself_and_both_sources(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    from importlib.metadata import EntryPoint

    from colab_graphs import registry

    (tmp_path / "clashing_plugin.py").write_text(
        "from colab_graphs import aggregator\n\n@aggregator('vote')\ndef vote(inputs, *, task, **params):\n"
        "    return 'mine'\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    plugin = EntryPoint("clashing", "clashing_plugin", registry.PLUGIN_GROUP)
    monkeypatch.setattr(registry, "entry_points", lambda group: [plugin])
    monkeypatch.setattr(registry, "_plugins_loaded", False)
    with pytest.raises(registry.PluginError) as raised:
        registry.load_plugins()
    message = str(raised.value)
    assert "plugin 'clashing' (clashing_plugin)" in message
    assert "colab_graphs.aggregators.vote" in message and "clashing_plugin.vote" in message


def test_a_fit_step_declared_in_the_registration_is_what_fit_coalition_runs():
    import asyncio

    from colab_graphs import GraphBuilder, Pool, protocol
    from colab_graphs.fitting import Fitted, fit_coalition, fit_step_of
    from colab_graphs.models.client import ModelClient

    async def fit_by_name(spec, pool, *, client, scorer=None):
        return Fitted(spec.model_copy(update={"description": "fitted"}), {"members": list(spec.members)})

    @protocol(
        "fitted_in_the_registry", family="basic", description="a fitted one-seat protocol", fit=fit_by_name
    )
    def fitted(members, prompt: str = "{input}"):
        b = GraphBuilder("fitted_in_the_registry", members=members)
        b.seat("only", member=members[0], prompt=prompt, writes="answer")
        return b.chain("only").output("answer").build()

    spec = build_protocol("fitted_in_the_registry", ["a"])
    assert fit_step_of(spec) is fit_by_name
    done = asyncio.run(
        fit_coalition(spec, Pool.from_dict({"a": {"model": "openai/a"}}), client=ModelClient(None))
    )
    assert done is not None and done.spec.description == "fitted" and done.record == {"members": ["a"]}
    assert fit_step_of(build_protocol("majority_vote", ["a"])) is None
