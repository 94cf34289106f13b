"""Drop a zoo model or a trained C-RL policy into a LangGraph agent app.

The agent has two steps: a chat model (any LiteLLM model: a zoo model in process, a policy folder written by
`colab-graphs train`, or a served model) drafts a plan, then a colab-graphs protocol compiled to LangGraph
answers as a subgraph. Offline:

    python examples/agent_app.py "What is 12 + 30?"
    python examples/agent_app.py --model local/path/to/policy "What is 12 + 30?"
    colab-graphs serve path/to/policy --port 8011 &
    python examples/agent_app.py --model openai/policy --api-base http://127.0.0.1:8011/v1 "What is 12 + 30?"
"""

from __future__ import annotations

import argparse
from typing import TypedDict

from langchain_core.messages import HumanMessage
from langgraph.graph import END, START, StateGraph

import colab_graphs._env  # noqa: F401  (offline settings first)
from colab_graphs import Pool, build_protocol, compile_graph
from colab_graphs.models.chat_model import LiteLLMChatModel


class AppState(TypedDict, total=False):
    question: str
    plan: str
    input: str
    answer: str


def build_app(model: str, api_base: str | None = None):
    settings = {
        "temperature": 0,
        "max_tokens": 48,
        **({"api_base": api_base, "api_key": "none"} if api_base else {}),
    }
    planner = LiteLLMChatModel(model=model, settings=settings)

    def plan(state: AppState) -> AppState:
        reply = planner.invoke([HumanMessage(f"In one sentence, how would you solve: {state['question']}")])
        return {"plan": reply.content, "input": f"{state['question']}\n(Hint: {reply.content})"}

    # The team: the same model in two personas, voting. Its compiled graph reads `input`, writes `answer`.
    pool = Pool.from_dict(
        {
            "careful": {
                "model": model,
                **settings,
                "system_prompt": "You are careful. Give the final number.",
            },
            "terse": {"model": model, **settings, "system_prompt": "Answer with just the number."},
        }
    )
    team = compile_graph(build_protocol("majority_vote", pool.names), pool)

    app = StateGraph(AppState)
    app.add_node("plan", plan)
    app.add_node("team", team)
    app.add_edge(START, "plan")
    app.add_edge("plan", "team")
    app.add_edge("team", END)
    return app.compile()


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("question", nargs="?", default="What is 12 + 30?")
    parser.add_argument("--model", default="local/smollm2-135m")
    parser.add_argument("--api-base", default=None)
    args = parser.parse_args()
    result = build_app(args.model, args.api_base).invoke({"question": args.question})
    print(f"plan:   {result['plan']}\nanswer: {result['answer']}")


if __name__ == "__main__":
    main()
