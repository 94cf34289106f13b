"""The package's process defaults (`colab_graphs._env`): no process-wide offline switch, and the defaults in
force for a library user as for the CLI.

Each check runs a fresh interpreter with name resolution watched (`WATCH_HOSTS`):
- importing the CLI and the training pipeline leaves the hub reachable for a user's hub id, and the offline
  paths (the zoo, the in-process policy) reach no host anyway;
- importing the package sets the defaults (litellm reads them when it loads, and a user's code may import it
  next), and one call through the public API (`ModelClient` against the scripted OpenAI-compatible server, no
  CLI module imported) resolves no outside host and does not try to download litellm's price table (seconds
  of blocking retries where there is no network).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

WATCH_HOSTS = """
import asyncio, json, os, socket

hosts = []
resolve = socket.getaddrinfo

def watched(host, *args, **kwargs):
    if host not in (None, "localhost", "::1") and not str(host).startswith("127."):
        hosts.append(str(host))
    return resolve(host, *args, **kwargs)

socket.getaddrinfo = watched
"""

OFFLINE_PATHS = WATCH_HOSTS + textwrap.dedent(
    """
    import colab_graphs.cli.app  # noqa: F401  (the CLI entry)
    import colab_graphs.trainers.pipeline  # noqa: F401  (the training pipeline)
    import huggingface_hub.constants
    from colab_graphs.local.provider import get_engine
    from colab_graphs.local.local_engine import GenerationRequest
    from colab_graphs.trainers.system import load_policy

    model, tokenizer = load_policy("tiny-random", "cpu")
    engine = get_engine("tiny-random")
    prompt = engine.render([{"role": "user", "content": "What is 2 + 2?"}])
    result = engine.generate(GenerationRequest(prompt_ids=prompt, max_tokens=3, temperature=0.0))
    print(json.dumps({
        "env": {k: os.environ.get(k) for k in ("HF_HUB_OFFLINE", "LITELLM_OFFLINE_MODE", "TRANSFORMERS_OFFLINE")},
        "hub_offline": huggingface_hub.constants.HF_HUB_OFFLINE,
        "generated": len(result.completion_ids),
        "hosts": hosts,
    }))
    """
)

LIBRARY_CALL = WATCH_HOSTS + textwrap.dedent(
    """
    from colab_graphs import Member, ModelClient
    from colab_graphs.testing import ScriptedServer

    local_prices = os.environ.get("LITELLM_LOCAL_MODEL_COST_MAP")  # set by the package's import

    async def main():
        with ScriptedServer({"alpha": "The answer is 42."}) as server:
            member = Member(name="a", settings=server.litellm_kwargs("alpha"))
            return await ModelClient(None).complete(member, [{"role": "user", "content": "6 x 7?"}])

    result = asyncio.run(main())
    print(json.dumps({"text": result.text, "hosts": hosts, "local_prices": local_prices}))
    """
)


@pytest.mark.slow
def test_the_package_sets_no_offline_switch_and_its_offline_paths_reach_no_host() -> None:
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("HF_HUB_OFFLINE", "LITELLM_OFFLINE_MODE", "TRANSFORMERS_OFFLINE", "HF_DATASETS_OFFLINE")
    }
    proc = subprocess.run(
        [sys.executable, "-c", OFFLINE_PATHS],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    assert report["env"] == {
        "HF_HUB_OFFLINE": None,
        "LITELLM_OFFLINE_MODE": None,
        "TRANSFORMERS_OFFLINE": None,
    }
    assert report["hub_offline"] is False  # a policy or collaborator given as a hub id can be fetched
    assert report["generated"] >= 1
    assert report["hosts"] == []  # the zoo model and the in-process policy never touched the network


def test_a_library_call_resolves_no_outside_host_and_fetches_no_price_table() -> None:
    from colab_graphs._env import _DEFAULTS

    env = {k: v for k, v in os.environ.items() if k not in _DEFAULTS}  # (this process has them set)
    proc = subprocess.run(
        [sys.executable, "-c", LIBRARY_CALL],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    found = json.loads(proc.stdout.strip().splitlines()[-1])
    assert found == {"text": "The answer is 42.", "hosts": [], "local_prices": "True"}
    assert "cost map" not in proc.stderr
