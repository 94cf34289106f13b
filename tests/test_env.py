"""The package's process defaults (`colab_graphs._env`) are in force for a library user, not only the CLI.

A fresh interpreter imports the package (the defaults must then be set: litellm reads them when it loads, and
a user's code may import it next), then makes one call through the public API (`ModelClient` against the scripted
OpenAI-compatible server, no CLI module imported) with name resolution watched: litellm must not try to
download its price table (seconds of blocking retries where there is no network), and no outside host is
resolved.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

PROBE = textwrap.dedent(
    """
    import asyncio, json, socket

    hosts = []
    resolve = socket.getaddrinfo

    def watched(host, *args, **kwargs):
        if host not in (None, "localhost", "::1") and not str(host).startswith("127."):
            hosts.append(str(host))
        return resolve(host, *args, **kwargs)

    socket.getaddrinfo = watched

    import os

    from colab_graphs import Member, ModelClient

    local_prices = os.environ.get("LITELLM_LOCAL_MODEL_COST_MAP")
    from colab_graphs.testing import ScriptedServer

    async def main():
        with ScriptedServer({"alpha": "The answer is 42."}) as server:
            member = Member(name="a", settings=server.litellm_kwargs("alpha"))
            return await ModelClient(None).complete(member, [{"role": "user", "content": "6 x 7?"}])

    result = asyncio.run(main())
    print(json.dumps({"text": result.text, "hosts": hosts, "local_prices": local_prices}))
    """
)


def test_a_library_call_resolves_no_outside_host_and_fetches_no_price_table() -> None:
    from colab_graphs._env import _DEFAULTS

    env = {k: v for k, v in os.environ.items() if k not in _DEFAULTS}  # (this process has them set)
    proc = subprocess.run(
        [sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, timeout=300, check=False
    )
    assert proc.returncode == 0, proc.stderr
    found = json.loads(proc.stdout.strip().splitlines()[-1])
    assert found == {"text": "The answer is 42.", "hosts": [], "local_prices": "True"}
    assert "cost map" not in proc.stderr
