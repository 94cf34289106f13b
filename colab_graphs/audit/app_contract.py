"""How a user's LangGraph app meets the audit: what goes in, where the answer is read, how each play is configured.

`AppIO` is the declared mapping between an example and the app's own state, the same for `colab-graphs audit
--app` / `run --app` (`--input-key`, `--answer-key`, `--mode`), the Python API (`run_audit(app, ...,
input_key=, answer_key=, mode=)`, `run(app, ...)`) and apps named in a `langgraph.json`:

- mode "keys": the question goes in as ``{input_key: question}`` (default ``input``) and the answer is the final
  state's ``answer_key`` (default ``answer``; a message's text when the app stored a message, the last AI
  message's text when it stored a list of messages);
- mode "messages" (`MessagesState` apps): the question goes in as a `HumanMessage` in ``messages`` and the
  answer is the text of the last AI message of the final ``messages`` (or the ``answer_key`` when one is given);
- mode "value" (LangGraph's Functional API): the question itself is the app's input (an `@entrypoint` taking
  ``question: str``; ``[HumanMessage(question)]`` for one taking a list of messages, as the quickstart's);
- mode "auto" (the default): "value" when the app's input is a str or a list (`input_kind`: its schema, else
  the entrypoint's signature), "messages" when its input schema has ``messages`` and no input key was given
  and the schema has no ``input``, else "keys"; an entrypoint whose parameter has no type is refused (a guess
  would reach the prompts). The choice is recorded (`AppIO.params`, the report's parameters) and the CLI says
  so.

In every mode, a value the app returns that is not a state (a str, a message, a list of messages: what an
entrypoint returns) is the answer itself; a state (a mapping, a pydantic model) is read at the answer key.

Fail closed: what can be told from the app's schemas before any call is checked then (`AppIO.resolve`: an input
key the app's input schema lacks, an answer key its output lacks), with an error naming the key, the keys the
app does have and the option to pass. What only a run shows is checked on the play of the whole pool: a final
state without the answer key (or without an AI message) is an error naming the keys the final state has; a
smaller coalition whose run ends without it gives an empty answer. A `KeyError` for a key the audit did not
send (and the app's input schema, where it has one, holds) on the whole pool's play stops the audit, saying
what the audit sends and how to map it (with a member absent, a missing key is the app's own: that example
fails, reported). Nothing here turns a broken contract into a score of 0.

`PlayRun` configures one play: a fresh ``thread_id`` in ``configurable`` (so an app compiled with a checkpointer
is audited unchanged, each play on its own thread: nothing leaks between coalitions or examples; the thread is
deleted from the app's checkpointer when the play ends), and a callback that records the play's runs: the
node where the app called `interrupt()` (an audit plays the app unattended, so an interrupt is an error
naming that node and the coalition played), and the graph a call's node ran in (`_NodeWatch.graph_of`: how a
prebuilt agent's call is reported under the agent's name).
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, Literal
from uuid import UUID

from langchain_core.callbacks import BaseCallbackHandler

Mode = Literal["auto", "keys", "messages", "value"]
MODES = ("auto", "keys", "messages", "value")
DEFAULT_INPUT = "input"
DEFAULT_ANSWER = "answer"
MESSAGES = "messages"
# Keys an app's state is likely to hold its question / its answer under, suggested in that order.
INPUT_NAMES = ("question", "query", "prompt", "problem", "task", "user_input", "text", "request")
ANSWER_NAMES = ("final_answer", "response", "output", "result", "reply", "generation", "final_response")


class AppError(ValueError):
    """An app reference or object that cannot be audited; the message names it and says why."""


class AppContractError(AppError):
    """The app and the audit do not meet: the message names the key, what the app has, and what to pass."""


def _option(flag: str, value: str) -> str:
    return f"pass --{flag} {value} ({flag.replace('-', '_')}={value!r} in Python)"


def _keys(keys: Sequence[str]) -> str:
    return ", ".join(sorted(keys)) if keys else "none"


def app_schema(app: Any, which: Literal["input", "output"]) -> Mapping[str, Any] | None:
    """The app's input or output JSON schema, a top-level ``$ref`` followed into its ``$defs`` (a TypedDict or
    pydantic model an entrypoint takes); None when the app cannot describe itself."""
    try:
        schema = app.get_input_jsonschema() if which == "input" else app.get_output_jsonschema()
    except Exception:  # noqa: BLE001 - any app may fail to describe itself: then only a run can tell
        return None
    if not isinstance(schema, Mapping):
        return None
    ref = schema.get("$ref")
    if isinstance(ref, str) and ref.startswith("#/$defs/"):
        target = (schema.get("$defs") or {}).get(ref.removeprefix("#/$defs/"))
        return target if isinstance(target, Mapping) else schema
    return schema


def schema_keys(app: Any, which: Literal["input", "output"]) -> list[str] | None:
    """The keys of the app's input or output schema; None when they cannot be told (a `StateGraph(dict)`, an
    object that is not a LangGraph graph, an entrypoint taking or returning a plain value)."""
    if which == "output":
        channels = getattr(app, "output_channels", None)
        if isinstance(channels, list | tuple) and channels:
            return [str(c) for c in channels]
    schema = app_schema(app, which)
    properties = schema.get("properties") if schema is not None else None
    return [str(k) for k in properties] if isinstance(properties, Mapping) and properties else None


@dataclass(frozen=True)
class AppIO:
    """The mapping between an example and the app's state (see the module docstring).

    Attributes:
        input_key: Where the question goes in mode "keys" (None: ``input``).
        answer_key: Where the answer is read (None: ``answer`` in mode "keys", the last AI message of
            ``messages`` in mode "messages"; an app that returns a plain value is read as that value).
        mode: "auto", "keys", "messages" or "value".
        detected: The mode was chosen by "auto" from the app's input schema.
        as_messages: Mode "value" sends ``[HumanMessage(question)]`` (an entrypoint taking a list of
            messages) instead of the question's text.
    """

    input_key: str | None = None
    answer_key: str | None = None
    mode: Mode = "auto"
    detected: bool = False
    as_messages: bool = False

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise AppContractError(f"mode must be one of {', '.join(MODES)}, got {self.mode!r}")
        for name, key in (("input_key", self.input_key), ("answer_key", self.answer_key)):
            if key is not None and (not isinstance(key, str) or not key.strip()):
                raise AppContractError(f"{name} must be a non-empty string, got {key!r}")
        if self.mode in ("messages", "value") and self.input_key is not None:
            raise AppContractError(
                f"mode {self.mode!r} sends the question as {self.sent}; input_key {self.input_key!r} does not "
                "apply (use mode 'keys' to send it under a key)"
            )

    @property
    def in_key(self) -> str:
        return MESSAGES if self.mode == "messages" else self.input_key or DEFAULT_INPUT

    @property
    def out_key(self) -> str:
        return self.answer_key or (MESSAGES if self.mode == "messages" else DEFAULT_ANSWER)

    @property
    def sent(self) -> str:
        """What the audit sends, in words."""
        if self.mode == "value":
            return "[HumanMessage(question)]" if self.as_messages else "the question itself (a str)"
        return "a HumanMessage in 'messages'" if self.mode == "messages" else f"{{{self.in_key!r}: question}}"

    def params(self) -> dict[str, Any]:
        """What the report and the log record of the mapping; empty for the default one (``input`` -> ``answer``)."""
        if self.mode == "keys" and self.in_key == DEFAULT_INPUT and self.out_key == DEFAULT_ANSWER:
            return {}
        params: dict[str, Any] = {"mode": self.mode}
        if self.mode == "keys":
            params.update(input_key=self.in_key, answer_key=self.out_key)
        elif self.answer_key:
            params["answer_key"] = self.answer_key
        if self.as_messages:
            params["input"] = "messages"
        if self.detected:
            params["detected"] = True
        return params

    def note(self, name: str) -> str | None:
        """The sentence saying which mode was detected (None when none was)."""
        if not self.detected:
            return None
        if self.mode == "value":
            takes = "a list of messages" if self.as_messages else "a str"
            return (
                f"app {name!r}: its input is {takes} (a Functional API entrypoint): sending it {self.sent} and "
                "reading the answer from what it returns (--mode keys to send {'input': question} instead)"
            )
        answer = f"the final state's {self.answer_key!r}" if self.answer_key else "the last AI message's text"
        return (
            f"app {name!r}: its input schema has 'messages' and no 'input': auditing it as a MessagesState app "
            f"(the question as a HumanMessage in 'messages', the answer {answer}; --mode keys to turn this off)"
        )

    def resolve(self, app: Any, what: str) -> AppIO:
        """This mapping with mode "auto" decided, checked against the app's schemas before any call; raises
        `AppContractError` naming each key the app's schemas lack (what they have, and what to pass)."""
        inputs, outputs = schema_keys(app, "input"), schema_keys(app, "output")
        kind = input_kind(app)
        takes = kind if kind in ("string", "array") else None
        io = self
        if self.mode == "auto":
            io = self._detect(app, inputs, kind, what)
        elif self.mode == "value":
            io = replace(self, as_messages=takes == "array")
        problems = []
        if io.mode in ("keys", "messages") and takes is not None:
            what_it_takes = "a str" if takes == "string" else "a list"
            problems.append(
                f"the app's input is {what_it_takes}, not a mapping, and the audit would send {io.sent}; pass "
                "--mode value (mode='value' in Python) to send it the question itself"
            )
        elif io.mode == "value" and inputs is not None:
            problems.append(
                f"mode 'value' sends {io.sent}, and the app's input schema has keys {_keys(inputs)} (it takes a "
                "mapping); " + _option("input-key", next((k for k in INPUT_NAMES if k in inputs), "KEY"))
            )
        elif io.mode != "value" and inputs is not None and io.in_key not in inputs:
            problems.append(io._missing_input(inputs))
        if outputs is not None and io.out_key not in outputs:
            problems.append(io._missing_answer(outputs, "output schema", inputs or []))
        if problems:
            raise AppContractError(f"{what}: " + "; and ".join(problems))
        return io

    def _detect(self, app: Any, inputs: Sequence[str] | None, kind: str | None, what: str) -> AppIO:
        """Mode "auto" decided: "value" for an app whose input is a str or a list (an entrypoint taking the
        question itself, or its messages), "messages" for a `MessagesState` app, else "keys"; an entrypoint
        whose input has no type is refused (nothing tells what to send it)."""
        if self.input_key is not None:
            return replace(self, mode="keys")
        if kind in ("string", "array"):
            return replace(self, mode="value", detected=True, as_messages=kind == "array")
        if inputs is not None and MESSAGES in inputs and DEFAULT_INPUT not in inputs:
            return replace(self, mode="messages", detected=True)
        if kind == "untyped":
            raise AppContractError(f"{what}: {_untyped_entrypoint(entrypoint_function(app))}")
        return replace(self, mode="keys")

    def _missing_input(self, inputs: Sequence[str]) -> str:
        said = f"the app's input schema has keys {_keys(inputs)} and no {self.in_key!r}, so it never reads "
        said += f"the question the audit sends ({self.sent})"
        guess = next((k for k in INPUT_NAMES if k in inputs), None)
        if MESSAGES in inputs:
            return said + "; pass --mode messages (mode='messages' in Python) to send it as a HumanMessage"
        return said + "; " + _option("input-key", guess or "KEY") + " to send it under the app's own key"

    def _missing_answer(self, outputs: Sequence[str], where: str, inputs: Sequence[str] = ()) -> str:
        said = f"the app's {where} has keys {_keys(outputs)} and no {self.out_key!r}, where the audit reads "
        said += "the answer"
        written = [k for k in outputs if k not in inputs and k != MESSAGES]
        guess = next((k for k in ANSWER_NAMES if k in outputs), written[0] if len(written) == 1 else None)
        hints = [_option("answer-key", guess or "KEY")]
        if MESSAGES in outputs and self.mode != "messages":
            hints.append("--mode messages (mode='messages') to read the last AI message")
        return f"{said}; {' or '.join(hints)}"

    def input_state(self, question: str) -> Any:
        """The app's input for one example's question."""
        if self.mode in ("messages", "value"):
            from langchain_core.messages import HumanMessage

            if self.mode == "messages":
                return {MESSAGES: [HumanMessage(question)]}
            return [HumanMessage(question)] if self.as_messages else question
        return {self.in_key: question}

    def answer(self, final: Any, *, full: bool) -> str:
        """The answer in what the app returned (`full`: the whole pool played, where a missing answer is an
        `AppContractError` naming what the app returned; elsewhere it is an empty answer).

        A state (a mapping, a pydantic model or dataclass) is read at `out_key`; a plain value an app returned
        (a Functional API entrypoint's str, message or list of messages) is the answer itself. A message is read
        as its text, a list of messages as its last AI message's (`last_ai_text`), anything else as `str` of it.
        Never a default that scores: a missing or None answer, or a list with no AI message, is an error on the
        whole pool's play and an empty answer elsewhere."""
        if not isinstance(final, Mapping) and not _is_state_object(final):
            return self._returned(final, full=full)
        state = final if isinstance(final, Mapping) else final.__dict__
        if self.out_key not in state or state[self.out_key] is None:
            if not full:
                return ""
            if self.out_key in state:
                raise AppContractError(
                    f"the app's final {self.out_key!r} is None, where the audit reads the answer (the app ran "
                    "with every member present and wrote no answer there)"
                )
            raise AppContractError(
                self._missing_answer([k for k in state if not k.startswith("__")], "final state")
                + " (the app ran with every member present and ended without it)"
            )
        return _text(state[self.out_key], f"final {self.out_key!r} holds", full=full)

    def _returned(self, value: Any, *, full: bool) -> str:
        """The answer in a plain value the app returned (not a state)."""
        if not full:
            return "" if value is None or self.answer_key is not None else _text(value, "", full=False)
        if value is None:
            raise AppContractError(
                "the app returned None (with every member present), where the audit reads the answer: return "
                "the answer's text (or a state holding it, with --answer-key)"
            )
        if self.answer_key is not None:
            raise AppContractError(
                f"the app returned a {'str' if isinstance(value, str) else type(value).__name__}, not a state "
                f"holding {self.answer_key!r}: what it "
                "returns is the answer; drop --answer-key (answer_key=None)"
            )
        return _text(value, "returned", full=True)

    def key_error(self, exc: KeyError, sent: Any, inputs: Sequence[str] | None) -> str | None:
        """What to say of a `KeyError` the app raised for a key the audit did not send, that the app's input
        schema (`inputs`; None: unknown) may hold (None for any other: an app's own lookup)."""
        key = exc.args[0] if exc.args else None
        if not isinstance(sent, Mapping) or not isinstance(key, str) or key in sent:
            return None
        if inputs is not None and key not in inputs:
            return None
        hint = _option("input-key", key) if key != MESSAGES else "pass --mode messages (mode='messages')"
        return (
            f"the app raised KeyError: {key!r}: the audit sends the question as {self.sent} and nothing else; if "
            f"the app reads its question from {key!r}, {hint}"
        )


def _is_state_object(value: Any) -> bool:
    """A pydantic model or dataclass an app returned as its state (a message is not one: it is a value)."""
    from langchain_core.messages import BaseMessage

    return hasattr(value, "__dict__") and not isinstance(value, str | BaseMessage | type)


def _text(value: Any, holds: str, *, full: bool) -> str:
    """`value` as an answer's text; a list of messages without an AI message is an error (`full`) or ""."""
    if not isinstance(value, list | tuple):
        return message_text(value)
    text = last_ai_text(value)
    if text is not None:
        return text
    if full:
        raise AppContractError(
            f"the app's {holds} {len(value)} message(s) and no AI message (the audit reads the answer from the "
            "last one)"
        )
    return ""


def input_kind(app: Any) -> Literal["string", "array", "object", "untyped"] | None:
    """What the app takes: "string", "array" or "object" from its input schema; for an entrypoint whose
    schema says nothing (or that LangGraph cannot build: a type named under `from __future__ import
    annotations`), from its function's first parameter, "untyped" when it has no annotation (or `Any`); None
    for an app that cannot tell."""
    import inspect
    import typing

    schema = app_schema(app, "input") or {}
    kind = schema.get("type")
    if kind in ("string", "array", "object"):
        return kind  # type: ignore[no-any-return]
    if any(k in schema for k in ("properties", "anyOf", "oneOf", "allOf")):
        return "object"
    function = entrypoint_function(app)
    if function is None:
        return None
    parameter = next(iter(inspect.signature(function).parameters.values()), None)
    annotation = parameter.annotation if parameter is not None else inspect.Parameter.empty
    if isinstance(annotation, str):  # unevaluated (no eval here: its names may not resolve), read as written
        name = annotation.replace("typing.", "").split("[")[0].strip()
        annotation = {
            "str": str,
            "Any": Any,
            "list": list,
            "List": list,
            "Sequence": list,
            "tuple": tuple,
        }.get(name, annotation)
    if annotation in (inspect.Parameter.empty, Any):
        return "untyped"
    if annotation is str:
        return "string"
    origin = typing.get_origin(annotation) or annotation
    return "array" if isinstance(origin, type) and issubclass(origin, list | tuple | Sequence) else "object"


def entrypoint_function(app: Any) -> Any:
    """The function a LangGraph Functional API `@entrypoint` wraps; None for any other app."""
    from langgraph.graph.state import CompiledStateGraph
    from langgraph.pregel import Pregel

    if not isinstance(app, Pregel) or isinstance(app, CompiledStateGraph) or len(app.nodes) != 1:
        return None
    if app.input_channels != "__start__" or app.output_channels != "__end__":
        return None
    bound = next(iter(app.nodes.values())).bound
    return getattr(bound, "func", None) or getattr(bound, "afunc", None)


def _untyped_entrypoint(function: Any) -> str:
    """Why an entrypoint whose parameter has no type cannot be sent anything safely, and what to do."""
    import inspect

    name = getattr(function, "__name__", "entrypoint")
    try:
        param = next(iter(inspect.signature(function).parameters), "inputs")
    except (TypeError, ValueError):
        param = "inputs"
    return (
        f"its entrypoint {name}({param}) does not say what it takes (its parameter has no type): the question "
        f"itself or a mapping, a guess either way would reach the models' prompts; annotate it ({param}: str "
        f"is sent the question, {param}: dict is sent {{'input': question}}), or pass --mode value "
        "(mode='value' in Python) to send the question itself, or --input-key KEY to send {KEY: question}"
    )


def message_text(value: Any) -> str:
    """A value as text: a message's text, else `str` of it."""
    text = getattr(value, "text", None)
    if text is None or isinstance(value, str):
        return str(value)
    return str(text) if isinstance(text, str) or not callable(text) else str(text())  # (older: a method)


def last_ai_text(messages: Sequence[Any]) -> str | None:
    """The text of the last AI message (a LangChain `AIMessage` or chunk, or what LangChain reads as one: a
    mapping with role "assistant", an ``("ai", text)`` pair); None when there is none.

    Defends against a final state that ends with something other than the model's answer: a human or system
    message after it (a follow-up quoting "The answer is 42"), a tool's result, an AI message's reasoning or
    thinking blocks (only its text blocks are its text)."""
    from langchain_core.messages import AIMessage, BaseMessage, convert_to_messages

    for message in reversed(list(messages)):
        if not isinstance(message, BaseMessage):
            try:
                message = convert_to_messages([message])[0]
            except (ValueError, TypeError, KeyError, NotImplementedError):
                continue
        if isinstance(message, AIMessage):
            return message_text(message)
    return None


class _NodeWatch(BaseCallbackHandler):
    """Records the chains of one play, each with its parent: which node a call ran in, and inside which graph
    (`graph_of`), and where an `interrupt()` was raised, with the nodes it ran inside (a subgraph's node within
    the parent's). Inline (it never needs a thread), and it hears only chains: model calls, tools and retrievers
    pass it by."""

    run_inline = True
    ignore_llm = ignore_chat_model = ignore_agent = ignore_retriever = ignore_retry = True
    ignore_custom_event = True

    def __init__(self) -> None:
        self.parents: dict[UUID, UUID | None] = {}
        self.names: dict[UUID, str] = {}  # every chain's name (a graph's run is named after the graph)
        self.nodes: dict[UUID, str] = {}
        self.raised: list[tuple[UUID, str]] = []  # (run, node) of each node an interrupt went through
        self.interrupted: list[str] = []  # where each interrupt was called, "node (inside 'outer')"

    def on_chain_start(self, serialized: Any, inputs: Any, *, run_id: UUID, **kwargs: Any) -> None:
        self.parents[run_id] = kwargs.get("parent_run_id")
        name = kwargs.get("name")
        if isinstance(name, str):
            self.names[run_id] = name
        node = (kwargs.get("metadata") or {}).get("langgraph_node")
        if node is not None and name == node:
            self.nodes[run_id] = str(node)

    def graph_of(self, run: UUID | None) -> str | None:
        """The name of the graph whose node `run` is in (the innermost node run at or above `run`, then the
        graph run that started it); None when unknown or unnamed ("LangGraph", LangGraph's default)."""
        while run is not None and run not in self.nodes:
            run = self.parents.get(run)
        graph = self.parents.get(run) if run is not None else None
        name = self.names.get(graph) if graph is not None else None
        return name if name and name != "LangGraph" else None

    def on_chain_error(self, error: BaseException, *, run_id: UUID, **kwargs: Any) -> None:
        node = self.nodes.get(run_id)
        if node is None or type(error).__name__ != "GraphInterrupt":
            return
        self.raised.append((run_id, node))
        self.interrupted = []
        for inner, name in self.raised:  # innermost first: the nodes an inner one ran inside are its "outer"
            outer = [n for run, n in self.raised if run != inner and self._within(inner, run)]
            if not any(self._within(run, inner) for run, _ in self.raised if run != inner):
                shown = repr(name) + (f" (inside {', '.join(map(repr, outer))})" if outer else "")
                self.interrupted.append(shown)

    def _within(self, run: UUID | None, ancestor: UUID) -> bool:
        while run is not None:
            run = self.parents.get(run)
            if run == ancestor:
                return True
        return False


class PlayRun:
    """One play of an app: its config (a fresh ``thread_id``, the interrupt watch) and what it ends with."""

    def __init__(self, app: Any):
        self.app = app
        self.thread_id = f"colab-graphs-{uuid.uuid4().hex}"
        self.watch = _NodeWatch()

    def config(self, config: Mapping[str, Any] | None) -> dict[str, Any]:
        """`config` with this play's ``thread_id`` in ``configurable`` and the watch among its callbacks."""
        config = dict(config or {})
        config["configurable"] = {**(config.get("configurable") or {}), "thread_id": self.thread_id}
        callbacks = config.get("callbacks")
        if callbacks is None:
            config["callbacks"] = [self.watch]
        elif isinstance(callbacks, list):
            config["callbacks"] = [*callbacks, self.watch]
        else:  # a callback manager
            manager = callbacks.copy()
            manager.add_handler(self.watch)
            config["callbacks"] = manager
        return config

    def check(self, final: Any, played: str = "") -> None:
        """Raise `AppContractError` when the run was interrupted (`interrupt()`), naming the node(s) and the
        play (`played`: which coalition, in words; an interrupt may be reached only without some member)."""
        interrupts = final.get("__interrupt__") if isinstance(final, Mapping) else None
        if not interrupts and not self.watch.interrupted:
            return
        where = ", ".join(self.watch.interrupted) or "an unnamed node"
        values = "; ".join(repr(getattr(i, "value", i)) for i in interrupts or ())
        asked = f" asking {values}" if values else ""
        raise AppContractError(
            f"the app called interrupt() in node {where}{asked}{played}: an audit plays the app unattended, with "
            "nobody to "
            "answer (Command(resume=...)); audit a version that does not wait for a human (e.g. the interrupt "
            "behind a flag, or a default reply)"
        )

    async def close(self) -> None:
        """Delete this play's thread from the app's checkpointer (the audit's threads are its own)."""
        checkpointer = getattr(self.app, "checkpointer", None)
        delete = getattr(checkpointer, "adelete_thread", None)
        if delete is not None:
            with contextlib.suppress(NotImplementedError):
                await delete(self.thread_id)
