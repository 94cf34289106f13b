"""What checking requests costs `colab-graphs serve`: throughput with and without validation, one process.

Run: ``python bench/serve_validation.py [--requests 240] [--concurrency 16] [--max-tokens 4] [--rounds 3]``

Two servers share one tiny-random engine in this process: the real one, and one whose handler builds the
request objects without checking them (``model_construct``: the same rendering, budgeting, batching and
response code, minus the pydantic validation and the budget check's refusals). The same fixed load (a
typical agent turn: a system prompt, four messages and a tool list; greedy, a few tokens) goes to each in
alternating rounds over keep-alive HTTP connections, and the figure is the ratio of requests per second.
tiny-random decodes in microseconds, so validation is as large a share of a request as it can be; a real
model makes it smaller still. It also times `parse_body` alone on the same body.
"""

from __future__ import annotations

import argparse
import datetime
import http.client
import json
import os
import platform
import statistics
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import colab_graphs._env  # noqa: F401
from colab_graphs.local.provider import get_engine
from colab_graphs.serve import server as serve_module
from colab_graphs.serve.openai_api import ChatCompletionRequest, FunctionSpec, Message, Tool, parse_body
from colab_graphs.serve.serve_replies import ChatReply

BODY: dict[str, Any] = {
    "model": "tiny",
    "messages": [
        {"role": "system", "content": "You are a careful assistant. Use the calculator for arithmetic."},
        {"role": "user", "content": "What is 12 times 7?"},
        {"role": "assistant", "content": "Let me think about it."},
        {"role": "user", "content": "Please answer briefly."},
    ],
    "tools": [
        {
            "type": "function",
            "function": {
                "name": "calc",
                "description": "Evaluate an arithmetic expression.",
                "parameters": {
                    "type": "object",
                    "properties": {"expression": {"type": "string"}},
                    "required": ["expression"],
                },
            },
        }
    ],
    "tool_choice": "auto",
    "temperature": 0,
    "max_tokens": 4,
    "seed": 1,
}


class _Unchecked(serve_module._Handler):
    """The real handler minus validation: request objects built from the body as it came."""

    def chat(self, body: Any) -> None:
        fields = dict(body)
        fields["messages"] = [Message.model_construct(**m) for m in body["messages"]]
        fields["tools"] = [
            Tool.model_construct(type=t["type"], function=FunctionSpec.model_construct(**t["function"]))
            for t in body.get("tools") or []
        ] or None
        self._answer(ChatReply(self.state, ChatCompletionRequest.model_construct(**fields)))


def run_load(port: int, body: bytes, requests: int, concurrency: int) -> tuple[float, float]:
    """Requests per second, and CPU milliseconds of this process per request (server and client: the same for
    both servers, and unlike wall time not inflated by other processes), for `requests` POSTs spread over
    `concurrency` keep-alive connections."""

    def worker(count: int) -> None:
        connection = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
        for _ in range(count):
            connection.request("POST", "/v1/chat/completions", body, {"Content-Type": "application/json"})
            response = connection.getresponse()
            assert response.status == 200, response.read()
            response.read()
        connection.close()

    shares = [requests // concurrency + (i < requests % concurrency) for i in range(concurrency)]
    started, cpu = time.perf_counter(), time.process_time()
    with ThreadPoolExecutor(concurrency) as pool:
        list(pool.map(worker, shares))
    return requests / (time.perf_counter() - started), (time.process_time() - cpu) / requests * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=240)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--max-tokens", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()

    engine = get_engine("tiny-random")
    body = json.dumps({**BODY, "max_tokens": args.max_tokens}).encode()
    checked = serve_module.LocalServer(engine, "tiny", "127.0.0.1", 0).start()
    unchecked = serve_module.LocalServer(engine, "tiny", "127.0.0.1", 0)
    unchecked.httpd.handler = _Unchecked
    unchecked.start()
    try:
        run_load(checked.port, body, args.concurrency * 2, args.concurrency)  # warm-up: threads, caches
        run_load(unchecked.port, body, args.concurrency * 2, args.concurrency)
        rounds: dict[str, list[tuple[float, float]]] = {"checked": [], "unchecked": []}
        for i in range(args.rounds):  # alternating order, so drift in the machine's load cancels
            order = [("checked", checked), ("unchecked", unchecked)][:: 1 if i % 2 else -1]
            for name, served in order:
                rounds[name].append(run_load(served.port, body, args.requests, args.concurrency))
    finally:
        checked.close()
        unchecked.close()

    parsed = json.loads(body)
    started = time.perf_counter()
    for _ in range(2000):
        parse_body(ChatCompletionRequest, parsed)
    parse_us = (time.perf_counter() - started) / 2000 * 1e6

    def median(name: str, k: int) -> float:
        return statistics.median(x[k] for x in rounds[name])

    figures = {
        "date": datetime.date.today().isoformat(),
        "machine": f"{platform.machine()} {os.cpu_count()} CPUs, Python {platform.python_version()}",
        "load_average": round(os.getloadavg()[0], 2),
        "requests_per_round": args.requests,
        "rounds": args.rounds,
        "concurrency": args.concurrency,
        "max_tokens": args.max_tokens,
        "req_per_s_median": {
            "checked": round(median("checked", 0), 1),
            "unchecked": round(median("unchecked", 0), 1),
        },
        "cpu_ms_per_request_median": {
            "checked": round(median("checked", 1), 2),
            "unchecked": round(median("unchecked", 1), 2),
        },
        "throughput_ratio_checked_over_unchecked": round(median("checked", 0) / median("unchecked", 0), 3),
        "cpu_ratio_checked_over_unchecked": round(median("checked", 1) / median("unchecked", 1), 3),
        "parse_body_us": round(parse_us, 1),
    }
    print(json.dumps(figures, indent=2))


if __name__ == "__main__":
    main()
