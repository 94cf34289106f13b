"""No process-wide offline switch: importing the package leaves the hub reachable for a user's hub id, and
the offline paths (the zoo, the in-process policy) reach no host anyway.

Run in a fresh interpreter whose environment has no offline variable set, with name resolution watched.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

PROBE = textwrap.dedent(
    """
    import json, os, socket

    hosts = []
    resolve = socket.getaddrinfo

    def watched(host, *args, **kwargs):
        if host not in (None, "localhost", "::1") and not str(host).startswith("127."):
            hosts.append(str(host))
        return resolve(host, *args, **kwargs)

    socket.getaddrinfo = watched

    import colab_graphs.cli.app  # noqa: F401  (the CLI entry)
    import colab_graphs.trainers.pipeline  # noqa: F401  (the training pipeline)
    import huggingface_hub.constants
    from colab_graphs.models.local import get_engine
    from colab_graphs.models.local_engine import GenerationRequest
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


@pytest.mark.slow
def test_the_package_sets_no_offline_switch_and_its_offline_paths_reach_no_host() -> None:
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("HF_HUB_OFFLINE", "LITELLM_OFFLINE_MODE", "TRANSFORMERS_OFFLINE", "HF_DATASETS_OFFLINE")
    }
    proc = subprocess.run(
        [sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, timeout=300, check=False
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
