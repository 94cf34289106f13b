"""Scripted stand-ins for the models of the example agent apps, served over real HTTP by the scripted server.

Each is a small rule-based "model" that reads its request the way a model would (the conversation, the
tools it is offered) and answers or calls a tool in OpenAI's format; no script knows which coalition it is
playing in. Serve them and point a pool at them:

    python -m colab_graphs.testing.server --port 8011 --members examples/agent_members.py:SUPERVISOR_TEAM
    python -m colab_graphs.testing.server --port 8012 --members examples/agent_members.py:CRITIC_TEAM

`SUPERVISOR_TEAM` plays `examples/agent_app.py` (supervisor, researcher, mathematician); `CRITIC_TEAM` plays
`examples/react_critic_app.py` (solver, critic). What each does, so that an audit's values can be worked out
by hand (tests/test_app_audit.py does):

- supervisor: hands a question with fewer than two numbers to the research agent first, then one with a
  number to the math agent, then answers with the last worker's number; a worker reporting itself
  unavailable makes it answer "I could not work it out."; alone (no tools) it answers "I don't know."
- researcher: looks the question up (its `lookup` tool) and reports the entry; alone it answers a question
  without numbers from memory and declines arithmetic.
- mathematician: multiplies (or adds, for "plus") the numbers of the question and of the research report
  with its tools and reports the result; alone it works out "A times B" / "A plus B" and nothing else.
- solver: computes the problem's expression with its calculator, but on a first attempt drops the last
  operation of a three-number expression; told by a reviewer, it computes the whole one. Alone (no tools) it
  says it needs a calculator.
- critic: works the expression out itself and approves the proposed answer or asks for a revision; alone it
  says it only reviews.
"""

from __future__ import annotations

import re
from typing import Any

from colab_graphs.testing import Reply, ToolCall

Messages = list[dict[str, Any]]
FACTS = {"spider": 8, "insect": 6, "hexagon": 6, "week": 7, "day": 24, "year": 12}


def _question(messages: Messages) -> str:
    return next((m["content"] for m in messages if m["role"] == "user"), "")


def _numbers(text: str) -> list[int]:
    return [int(n) for n in re.findall(r"\d+", text)]


def _offered(params: dict[str, Any]) -> set[str]:
    return {t["function"]["name"] for t in params.get("tools") or []}


def _tool_result(messages: Messages, params: dict[str, Any]) -> str | None:
    """The result of one of this member's own tools, when that is the last message (not another agent's
    handoff, which also arrives as a tool message)."""
    last = messages[-1]
    return last["content"] if last["role"] == "tool" and last.get("name") in _offered(params) else None


def _reports(messages: Messages) -> dict[str, str]:
    """The workers' final reports so far: name -> text (the last message of each that calls no tool)."""
    return {
        m["name"]: m.get("content") or ""
        for m in messages
        if m["role"] == "assistant"
        and m.get("name") in ("research_agent", "math_agent")
        and not m.get("tool_calls")
    }


def supervisor(messages: Messages, params: dict[str, Any]) -> str | Reply:
    if not _offered(params):
        return "I don't know."
    question, reports = _question(messages), _reports(messages)
    if any("unavailable" in text for text in reports.values()):
        return "I could not work it out."
    numbers = _numbers(question)
    if len(numbers) < 2 and "research_agent" not in reports:
        return Reply("", (ToolCall("transfer_to_research_agent", {}),))
    if numbers and "math_agent" not in reports:
        return Reply("", (ToolCall("transfer_to_math_agent", {}),))
    last = reports.get("math_agent") or reports.get("research_agent", "")
    found = _numbers(last)
    return f"The answer is {found[-1]}." if found else "I could not work it out."


def researcher(messages: Messages, params: dict[str, Any]) -> str | Reply:
    question = _question(messages)
    if (entry := _tool_result(messages, params)) is not None:
        return entry
    if "lookup" in _offered(params):
        return Reply("", (ToolCall("lookup", {"query": re.sub(r"\d+\s*", "", question)}),))
    known = [n for word, n in FACTS.items() if word in question.lower()]
    if _numbers(question) or not known:
        return "I only know facts; I don't do arithmetic."
    return f"The answer is {known[0]}."


def mathematician(messages: Messages, params: dict[str, Any]) -> str | Reply:
    question = _question(messages)
    if (output := _tool_result(messages, params)) is not None:
        result = float(output)
        return str(int(result) if result.is_integer() else result)
    operation = "add" if "plus" in question else "multiply"
    if {"add", "multiply"} <= _offered(params):
        numbers = _numbers(question) + _numbers(_reports(messages).get("research_agent", ""))
        if len(numbers) < 2:
            return "I need two numbers to work with."
        return Reply("", (ToolCall(operation, {"a": numbers[0], "b": numbers[1]}),))
    numbers = _numbers(question)
    if len(numbers) != 2 or not re.search(r"\d+ (times|plus) \d+", question):
        return "I don't know."
    a, b = numbers
    return f"The answer is {a + b if operation == 'add' else a * b}."


def _expression(text: str) -> str:
    match = re.search(r"\d[\d\s+\-*/()]*\d", text)
    return match.group(0).strip() if match else ""


def _evaluate(expression: str) -> float:
    if not re.fullmatch(r"[\d\s+\-*/()]+", expression):
        raise ValueError(f"not arithmetic: {expression!r}")
    return eval(expression)  # noqa: S307 - digits and operators only, checked above


def solver(messages: Messages, params: dict[str, Any]) -> str | Reply:
    if (output := _tool_result(messages, params)) is not None:
        return f"The answer is {output}."
    if "calculator" not in _offered(params):
        return "I need a calculator for that."
    task = _question(messages)
    expression = _expression(task.split("\n")[0])
    if "reviewer" not in task and len(_numbers(expression)) >= 3:
        expression = re.sub(r"\s*[+\-]\s*\d+$", "", expression)  # careless: the last operation dropped
    return Reply("", (ToolCall("calculator", {"expression": expression}),))


def critic(messages: Messages, params: dict[str, Any]) -> str:
    text = _question(messages)
    problem, _, proposed = text.partition("Proposed answer:")
    if not proposed:
        return "I only review answers."
    right = _evaluate(_expression(problem))
    given = _numbers(proposed)
    if given and given[-1] == right:
        return "APPROVE"
    return "REVISE: the answer leaves out part of the expression."


SUPERVISOR_TEAM = {"supervisor": supervisor, "researcher": researcher, "mathematician": mathematician}
CRITIC_TEAM = {"solver": solver, "critic": critic}
