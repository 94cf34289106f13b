"""How a user's LangGraph app meets the audit: what goes in, where the answer is read, how each play is configured.

`AppIO` is the declared mapping between an example and the app's own state, the same for `colab-graphs audit
--app` / `run --app` (`--input-key`, `--answer-key`, `--mode`), the Python API (`run_audit(app, ...,
input_key=, answer_key=, mode=)`, `run(app, ...)`) and apps named in a `langgraph.json`:

- mode "keys": the question goes in as ``{input_key: question}`` (default ``input``) and the answer is the final
  state's ``answer_key`` (default ``answer``; a message's text when the app stored a message, the last AI
  message's text when it stored a list of messages);
- mode "messages" (`MessagesState` apps): the question goes in as a `HumanMessage` in ``messages`` and the
  answer is the text of the last AI message of the final ``messages`` (or the ``answer_key`` when one is given);
- mode "auto" (the default): "messages" when the app's input schema has ``messages`` and no input key was given
  and the schema has no ``input``, else "keys". The choice is recorded (`AppIO.params`, the report's
  parameters) and the CLI says so.

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
deleted from the app's checkpointer when the play ends), and a callback that names the node where the app
called `interrupt()`: an audit plays the app unattended, so an interrupt is an error naming that node.
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal
from uuid import UUID

from langchain_core.callbacks import BaseCallbackHandler

Mode = Literal["auto", "keys", "messages"]
MODES = ("auto", "keys", "messages")
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


def schema_keys(app: Any, which: Literal["input", "output"]) -> list[str] | None:
    """The keys of the app's input or output schema; None when they cannot be told (a `StateGraph(dict)`, an
    object that is not a LangGraph graph)."""
    if which == "output":
        channels = getattr(app, "output_channels", None)
        if isinstance(channels, list | tuple) and channels:
            return [str(c) for c in channels]
    try:
        schema = app.get_input_jsonschema() if which == "input" else app.get_output_jsonschema()
    except Exception:  # noqa: BLE001 - any app may fail to describe itself: then only a run can tell
        return None
    properties = schema.get("properties") if isinstance(schema, Mapping) else None
    return [str(k) for k in properties] if isinstance(properties, Mapping) and properties else None


@dataclass(frozen=True)
class AppIO:
    """The mapping between an example and the app's state (see the module docstring).

    Attributes:
        input_key: Where the question goes in mode "keys" (None: ``input``).
        answer_key: Where the answer is read (None: ``answer`` in mode "keys", the last AI message of
            ``messages`` in mode "messages").
        mode: "auto", "keys" or "messages".
        detected: Mode "messages" was chosen by "auto" from the app's input schema.
    """

    input_key: str | None = None
    answer_key: str | None = None
    mode: Mode = "auto"
    detected: bool = False

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise AppContractError(f"mode must be one of {', '.join(MODES)}, got {self.mode!r}")
        for name, key in (("input_key", self.input_key), ("answer_key", self.answer_key)):
            if key is not None and (not isinstance(key, str) or not key.strip()):
                raise AppContractError(f"{name} must be a non-empty string, got {key!r}")
        if self.mode == "messages" and self.input_key is not None:
            raise AppContractError(
                f"mode 'messages' sends the question as a HumanMessage in 'messages'; input_key "
                f"{self.input_key!r} does not apply (use mode 'keys' to send it under a key)"
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
        return "a HumanMessage in 'messages'" if self.mode == "messages" else f"{{{self.in_key!r}: question}}"

    def params(self) -> dict[str, Any]:
        """What the report and the log record of the mapping; empty for the default one (``input`` -> ``answer``)."""
        if self.mode != "messages" and self.in_key == DEFAULT_INPUT and self.out_key == DEFAULT_ANSWER:
            return {}
        params: dict[str, Any] = {"mode": self.mode}
        if self.mode == "keys":
            params.update(input_key=self.in_key, answer_key=self.out_key)
        elif self.answer_key:
            params["answer_key"] = self.answer_key
        if self.detected:
            params["detected"] = True
        return params

    def note(self, name: str) -> str | None:
        """The sentence saying messages mode was detected (None when it was not)."""
        if not self.detected:
            return None
        answer = f"the final state's {self.answer_key!r}" if self.answer_key else "the last AI message's text"
        return (
            f"app {name!r}: its input schema has 'messages' and no 'input': auditing it as a MessagesState app "
            f"(the question as a HumanMessage in 'messages', the answer {answer}; --mode keys to turn this off)"
        )

    def resolve(self, app: Any, what: str) -> AppIO:
        """This mapping with mode "auto" decided, checked against the app's schemas before any call; raises
        `AppContractError` naming each key the app's schemas lack (what they have, and what to pass)."""
        inputs, outputs = schema_keys(app, "input"), schema_keys(app, "output")
        io = self
        if self.mode == "auto":
            messages = (
                self.input_key is None
                and inputs is not None
                and MESSAGES in inputs
                and DEFAULT_INPUT not in inputs
            )
            io = AppIO(self.input_key, self.answer_key, "messages" if messages else "keys", detected=messages)
        problems = []
        if inputs is not None and io.in_key not in inputs:
            problems.append(io._missing_input(inputs))
        if outputs is not None and io.out_key not in outputs:
            problems.append(io._missing_answer(outputs, "output schema", inputs or []))
        if problems:
            raise AppContractError(f"{what}: " + "; and ".join(problems))
        return io

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

    def input_state(self, question: str) -> dict[str, Any]:
        """The app's input for one example's question."""
        if self.mode == "messages":
            from langchain_core.messages import HumanMessage

            return {MESSAGES: [HumanMessage(question)]}
        return {self.in_key: question}

    def answer(self, final: Any, *, full: bool) -> str:
        """The answer in the app's final state (`full`: the whole pool played, where a missing answer is an
        `AppContractError` naming the keys the final state has; elsewhere it is an empty answer).

        A message is read as its text, a list of messages as its last AI message's (`last_ai_text`), anything
        else as `str` of it. Never a default that scores: a missing or None answer, or a list with no AI
        message, is an error on the whole pool's play and an empty answer elsewhere."""
        state = final if isinstance(final, Mapping) else getattr(final, "__dict__", {})
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
        value = state[self.out_key]
        if isinstance(value, list | tuple):
            text = last_ai_text(value)
            if text is None:
                if full:
                    raise AppContractError(
                        f"the app's final {self.out_key!r} holds {len(value)} message(s) and no AI message "
                        "(the audit reads the answer from the last one)"
                    )
                return ""
            return text
        return message_text(value)

    def key_error(self, exc: KeyError, sent: Mapping[str, Any], inputs: Sequence[str] | None) -> str | None:
        """What to say of a `KeyError` the app raised for a key the audit did not send, that the app's input
        schema (`inputs`; None: unknown) may hold (None for any other: an app's own lookup)."""
        key = exc.args[0] if exc.args else None
        if not isinstance(key, str) or key in sent or (inputs is not None and key not in inputs):
            return None
        hint = _option("input-key", key) if key != MESSAGES else "pass --mode messages (mode='messages')"
        return (
            f"the app raised KeyError: {key!r}: the audit sends the question as {self.sent} and nothing else; if "
            f"the app reads its question from {key!r}, {hint}"
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
    """Records the nodes where a run's `interrupt()` was raised, each with the nodes it ran inside (a subgraph's
    node within the parent's). Inline (it never needs a thread), and it hears only chains: model calls, tools
    and retrievers pass it by."""

    run_inline = True
    ignore_llm = ignore_chat_model = ignore_agent = ignore_retriever = ignore_retry = True
    ignore_custom_event = True

    def __init__(self) -> None:
        self.parents: dict[UUID, UUID | None] = {}
        self.nodes: dict[UUID, str] = {}
        self.raised: list[tuple[UUID, str]] = []  # (run, node) of each node an interrupt went through
        self.interrupted: list[str] = []  # where each interrupt was called, "node (inside 'outer')"

    def on_chain_start(self, serialized: Any, inputs: Any, *, run_id: UUID, **kwargs: Any) -> None:
        self.parents[run_id] = kwargs.get("parent_run_id")
        node = (kwargs.get("metadata") or {}).get("langgraph_node")
        if node is not None and kwargs.get("name") == node:
            self.nodes[run_id] = str(node)

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

    def check(self, final: Any) -> None:
        """Raise `AppContractError` when the run was interrupted (`interrupt()`), naming the node(s)."""
        interrupts = final.get("__interrupt__") if isinstance(final, Mapping) else None
        if not interrupts and not self.watch.interrupted:
            return
        where = ", ".join(self.watch.interrupted) or "an unnamed node"
        values = "; ".join(repr(getattr(i, "value", i)) for i in interrupts or ())
        asked = f" asking {values}" if values else ""
        raise AppContractError(
            f"the app called interrupt() in node {where}{asked}: an audit plays the app unattended, with nobody to "
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
