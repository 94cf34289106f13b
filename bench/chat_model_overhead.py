"""CPU the LangChain layers add per call, over the bare call path, measured on cache hits (no HTTP at all).

Modes, each serving the same N distinct requests from a warm call cache, on one event loop:

- `client`: `ModelClient.complete(...)`, the call path itself (the baseline);
- `chat model`: `LiteLLMChatModel.ainvoke(...)` (LangChain's BaseChatModel: callbacks, message conversion);
- `chat model, streamed`: `LiteLLMChatModel.astream(...)` (a cached reply is one chunk plus the last chunk);
- `seat, no listener`: a one-seat protocol's compiled graph, `ainvoke` with no callback handler;
- `seat, listener`: the same with a BaseCallbackHandler attached (the seat's chat-model events raised).

Process CPU per call (`time.process_time`), each mode's ratio to `client`.

Usage:
    python bench/chat_model_overhead.py [--calls 400]
"""

from __future__ import annotations

import argparse
import asyncio
import platform
import tempfile
import time
from datetime import date

from langchain_core.callbacks import BaseCallbackHandler

import colab_graphs._env  # noqa: F401  (offline settings before litellm loads)
from colab_graphs.builder import GraphBuilder
from colab_graphs.compile import compile_graph
from colab_graphs.langchain.chat_model import LiteLLMChatModel
from colab_graphs.models.cache import CallCache
from colab_graphs.models.client import ModelClient
from colab_graphs.pool import Pool
from colab_graphs.testing import ScriptedServer, echo


class Listener(BaseCallbackHandler):
    def on_llm_end(self, response, **kwargs) -> None:
        pass


async def measure(calls: int, server: ScriptedServer, cache_dir: str) -> dict[str, float]:
    pool = Pool.from_dict({"a": {"model": "openai/a", "api_base": server.base_url, "api_key": "k"}})
    client = ModelClient(CallCache(cache_dir))
    questions = [f"question {i}" for i in range(calls)]
    for q in questions:  # warm the cache: every mode below is served from it
        await client.complete(pool["a"], [{"role": "user", "content": q}])
    llm = LiteLLMChatModel(model="openai/a", api_base=server.base_url, api_key="k", client=client)
    spec = (
        GraphBuilder("one", members=["a"])
        .seat("s", member="a", prompt="{input}")
        .chain("s")
        .output("s")
        .build()
    )
    graph = compile_graph(spec, pool, client)

    async def streamed(q: str) -> None:
        async for _ in llm.astream(q):
            pass

    modes = {
        "client": lambda q: client.complete(pool["a"], [{"role": "user", "content": q}]),
        "chat model": lambda q: llm.ainvoke(q),
        "chat model, streamed": streamed,
        "seat, no listener": lambda q: graph.ainvoke({"input": q}),
        "seat, listener": lambda q: graph.ainvoke({"input": q}, config={"callbacks": [Listener()]}),
    }
    out = {}
    for name, call in modes.items():
        started = time.process_time()
        for q in questions:
            await call(q)
        out[name] = (time.process_time() - started) / calls * 1000
    return out


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--calls", type=int, default=400)
    args = parser.parse_args()
    with ScriptedServer({"a": echo()}) as server, tempfile.TemporaryDirectory() as cache_dir:
        ms = asyncio.run(measure(args.calls, server, cache_dir))
    print(f"{date.today()} {platform.processor() or platform.machine()}, {args.calls} cache hits per mode")
    print("| mode | CPU ms/call | x client |\n|---|---|---|")
    for name, value in ms.items():
        print(f"| {name} | {value:.3f} | {value / ms['client']:.1f} |")


if __name__ == "__main__":
    main()
