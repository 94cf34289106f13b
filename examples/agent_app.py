"""A multi-agent supervisor in LangGraph, written as LangGraph's supervisor tutorial writes it, whose models
are pool members, so that colab-graphs can audit what each member adds to the team.

A supervisor hands each question to a research agent (with an encyclopedia `lookup` tool) and a math agent
(with `add`, `multiply` and `divide`), one at a time, and answers from what they report. Every model is
`colab_graphs.member_chat_model(NAME)`: the supervisor, the researcher and the mathematician of your pool.
The app reads ``{"input": question}`` and writes ``answer``.

Audit it (each member's leave-one-out and exact Shapley value in this app):

    colab-graphs audit --app examples/agent_app.py:app --pool pool.yaml --data examples/agent_questions.jsonl \\
        --method exact

`team`, the tutorial's `MessagesState` graph as written, audits the same with no wrapper (the question goes in
as a HumanMessage, the answer is the last AI message: messages mode, detected from its input schema):

    colab-graphs audit --app examples/agent_app.py:team --pool pool.yaml --data examples/agent_questions.jsonl \\
        --method exact

Run it on one question:

    python examples/agent_app.py --pool pool.yaml "How many legs do 7 spiders have?"

With no model at hand, scripted members that call the tools over real HTTP stand in
(`examples/agent_members.py`); docs/apps.md shows their audit.
"""

from __future__ import annotations

import argparse
import asyncio
from typing import Annotated

from langchain.agents import create_agent
from langchain.tools import InjectedState, InjectedToolCallId, tool
from langchain_core.messages import AIMessage
from langgraph.graph import END, START, MessagesState, StateGraph
from langgraph.types import Command
from typing_extensions import TypedDict

import colab_graphs as cg

# --- 1. Worker agents ------------------------------------------------------------------------------------

ENCYCLOPEDIA = {
    "spider legs": "A spider has 8 legs.",
    "insect legs": "An insect has 6 legs.",
    "days week": "A week has 7 days.",
    "hours day": "A day has 24 hours.",
    "months year": "A year has 12 months.",
    "sides hexagon": "A hexagon has 6 sides.",
}


@tool
def lookup(query: str) -> str:
    """Look a fact up in the encyclopedia."""
    words = {w.rstrip("s") for w in query.lower().replace("?", "").split()}
    best = max(ENCYCLOPEDIA, key=lambda topic: len(words & {w.rstrip("s") for w in topic.split()}))
    return ENCYCLOPEDIA[best] if words & {w.rstrip("s") for w in best.split()} else "No entry found."


def add(a: float, b: float) -> float:
    """Add two numbers."""
    return a + b


def multiply(a: float, b: float) -> float:
    """Multiply two numbers."""
    return a * b


def divide(a: float, b: float) -> float:
    """Divide two numbers."""
    return a / b


research_agent = create_agent(
    model=cg.member_chat_model("researcher"),
    tools=[lookup],
    system_prompt=(
        "You are a research agent.\n\n"
        "INSTRUCTIONS:\n"
        "- Assist ONLY with research-related tasks, DO NOT do any math\n"
        "- After you're done with your tasks, respond to the supervisor directly\n"
        "- Respond ONLY with the results of your work, do NOT include ANY other text."
    ),
    name="research_agent",
)

math_agent = create_agent(
    model=cg.member_chat_model("mathematician"),
    tools=[add, multiply, divide],
    system_prompt=(
        "You are a math agent.\n\n"
        "INSTRUCTIONS:\n"
        "- Assist ONLY with math-related tasks\n"
        "- After you're done with your tasks, respond to the supervisor directly\n"
        "- Respond ONLY with the results of your work, do NOT include ANY other text."
    ),
    name="math_agent",
)


# --- 2. Handoffs and the supervisor ----------------------------------------------------------------------


def create_handoff_tool(*, agent_name: str, description: str | None = None):
    name = f"transfer_to_{agent_name}"
    description = description or f"Ask {agent_name} for help."

    @tool(name, description=description)
    def handoff_tool(
        state: Annotated[MessagesState, InjectedState],
        tool_call_id: Annotated[str, InjectedToolCallId],
    ) -> Command:
        tool_message = {
            "role": "tool",
            "content": f"Successfully transferred to {agent_name}",
            "name": name,
            "tool_call_id": tool_call_id,
        }
        return Command(
            goto=agent_name,
            update={**state, "messages": state["messages"] + [tool_message]},
            graph=Command.PARENT,
        )

    return handoff_tool


assign_to_research_agent = create_handoff_tool(
    agent_name="research_agent", description="Assign task to a researcher agent."
)
assign_to_math_agent = create_handoff_tool(
    agent_name="math_agent", description="Assign task to a math agent."
)

supervisor_agent = create_agent(
    model=cg.member_chat_model("supervisor"),
    tools=[assign_to_research_agent, assign_to_math_agent],
    system_prompt=(
        "You are a supervisor managing two agents:\n"
        "- a research agent. Assign research-related tasks to this agent\n"
        "- a math agent. Assign math-related tasks to this agent\n"
        "Assign work to one agent at a time, do not call agents in parallel.\n"
        "Do not do any work yourself. When you have the result, give the final answer as a number."
    ),
    name="supervisor",
)


def available(agent):
    """The worker as a node that reports back to the supervisor when its model is not in the team (an audit
    plays the team without it: its model then raises `colab_graphs.MemberAbsent`)."""

    async def node(state: MessagesState) -> dict:
        try:
            return await agent.ainvoke(state)
        except cg.MemberAbsent:
            return {"messages": [AIMessage(f"{agent.name} is unavailable.", name=agent.name)]}

    node.__name__ = agent.name
    return node


# --- 3. The multi-agent graph ----------------------------------------------------------------------------

team = (
    StateGraph(MessagesState)
    .add_node(supervisor_agent, destinations=("research_agent", "math_agent", END))
    .add_node("research_agent", available(research_agent))
    .add_node("math_agent", available(math_agent))
    .add_edge(START, "supervisor")
    # always return back to the supervisor
    .add_edge("research_agent", "supervisor")
    .add_edge("math_agent", "supervisor")
    .compile()
)


# --- 4. The app: a question in, the supervisor's last word out -------------------------------------------


class AppState(TypedDict, total=False):
    input: str
    answer: str


async def ask_the_team(state: AppState) -> AppState:
    result = await team.ainvoke({"messages": [{"role": "user", "content": state["input"]}]})
    return {"answer": result["messages"][-1].text}


app = (
    StateGraph(AppState)
    .add_node(ask_the_team)
    .add_edge(START, "ask_the_team")
    .compile(name="supervisor_team")
)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("question", nargs="?", default="How many legs do 7 spiders have?")
    parser.add_argument(
        "--pool", required=True, help="a pool with members supervisor, researcher, mathematician"
    )
    args = parser.parse_args()
    with cg.use_pool(args.pool):  # where the member chat models' calls go when no audit says otherwise
        print(asyncio.run(app.ainvoke({"input": args.question}))["answer"])


if __name__ == "__main__":
    main()
