"""A ReAct agent with a calculator and a critic, in LangGraph, whose two models are pool members.

The solver is LangChain's agent (`langchain.agents.create_agent`, a ReAct loop on LangGraph) with a
`calculator` tool; the critic reviews its answer and may send it back once with feedback. Both models are
`colab_graphs.member_chat_model(NAME)`: "solver" and "critic". The critic is optional (`on_absent="empty"`:
without it the draft stands), the solver is not (without it the app has no answer). The nodes are plain sync
functions, as many apps write them.

    colab-graphs audit --app examples/react_critic_app.py:app --pool pool.yaml \\
        --data examples/calculator_questions.jsonl --method exact
"""

from __future__ import annotations

import ast
import operator

from langchain.agents import create_agent
from langchain.tools import tool
from langgraph.graph import END, START, StateGraph
from typing_extensions import TypedDict

import colab_graphs as cg

_OPERATORS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv}


@tool
def calculator(expression: str) -> str:
    """Evaluate an arithmetic expression (+, -, *, / and parentheses)."""

    def value(node: ast.AST) -> float:
        if isinstance(node, ast.Constant) and isinstance(node.value, int | float):
            return node.value
        if isinstance(node, ast.BinOp) and type(node.op) in _OPERATORS:
            return _OPERATORS[type(node.op)](value(node.left), value(node.right))
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
            return -value(node.operand)
        raise ValueError(f"not arithmetic: {ast.unparse(node)}")

    result = value(ast.parse(expression, mode="eval").body)
    return str(int(result) if float(result).is_integer() else result)


solver = create_agent(
    model=cg.member_chat_model("solver"),
    tools=[calculator],
    system_prompt="Solve the problem. Use the calculator for arithmetic, then state the answer as a number.",
)

critic = cg.member_chat_model("critic", on_absent="empty")

CRITIC_PROMPT = (
    "You review answers to arithmetic problems. Reply APPROVE if the proposed answer is right, else "
    "REVISE: followed by what is wrong."
)


class State(TypedDict, total=False):
    input: str
    draft: str
    feedback: str
    revisions: int
    answer: str


def solve(state: State) -> State:
    task = state["input"]
    if state.get("feedback"):
        task += f"\n\nA reviewer said: {state['feedback']}\nSolve it again."
    result = solver.invoke({"messages": [("user", task)]})
    revisions = state.get("revisions", -1) + 1
    return {"draft": result["messages"][-1].text, "revisions": revisions}


def critique(state: State) -> State:
    review = critic.invoke(
        [("system", CRITIC_PROMPT), ("user", f"Problem: {state['input']}\nProposed answer: {state['draft']}")]
    )
    return {"feedback": review.text}


def after_review(state: State) -> str:
    return "solve" if state["feedback"].startswith("REVISE") and state["revisions"] < 1 else "finish"


def finish(state: State) -> State:
    return {"answer": state["draft"]}


app = (
    StateGraph(State)
    .add_node(solve)
    .add_node(critique)
    .add_node(finish)
    .add_edge(START, "solve")
    .add_edge("solve", "critique")
    .add_conditional_edges("critique", after_review, ["solve", "finish"])
    .add_edge("finish", END)
    .compile(name="react_with_critic")
)
