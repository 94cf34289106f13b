"""What `colab-graphs audit` has loaded when it sends its first request: what the request needs, not LiteLLM
(calls to an OpenAI-compatible server go direct, at a price the pool gives or the cache remembers), the plotting
library, torch or the viewer.

The command runs in a fresh interpreter against the scripted server; a wrapper around the direct lane's `post`
writes the loaded modules down when the first request goes out, and passes the request on.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest
from conftest import write_pool_file

pytestmark = pytest.mark.integration

AT_FIRST_REQUEST = textwrap.dedent(
    """
    import json, runpy, sys
    import colab_graphs.models.direct as direct

    posted, loaded, record = direct.post, {}, sys.argv[1]

    async def post(request):
        if not loaded:
            loaded["modules"] = sorted(sys.modules)
            with open(record, "w") as out:
                json.dump(loaded["modules"], out)
        return await posted(request)

    direct.post = post
    sys.argv = ["colab-graphs", *sys.argv[2:]]
    runpy.run_module("colab_graphs.cli.app", run_name="__main__")
    """
)
NOT_BEFORE_THE_FIRST_REQUEST = [
    "litellm",
    "openai",
    "matplotlib",
    "torch",
    "transformers",
    "networkx",
    "colab_graphs.viewer",
]


def audit_recording_modules(tmp_path, pool, out: str, limit: int = 4) -> set[str]:
    """Run `colab-graphs audit`; the modules it had loaded when it sent its first request."""
    record = tmp_path / f"{out}.modules.json"
    command = [sys.executable, "-c", AT_FIRST_REQUEST, str(record), "audit", "--protocol", "majority_vote",
               "--pool", str(pool), "--data", "builtin:arithmetic", "--limit", str(limit),
               "--out", str(tmp_path / out), "--cache-dir", str(tmp_path / "cache")]  # fmt: skip
    proc = subprocess.run(command, capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert (tmp_path / out / "contributions.png").is_file()  # the plots are still drawn, after the calls
    return set(json.loads(record.read_text()))


@pytest.mark.parametrize("priced", [True, False], ids=["priced-in-the-pool", "price-remembered-by-the-cache"])
def test_the_audit_command_loads_no_litellm_plots_or_torch_before_its_first_request(
    scripted_server, tmp_path, priced
):
    from colab_graphs.testing import arithmetic_solver

    names = ["a", "b", "c"]
    server = scripted_server({m: arithmetic_solver(accuracy=0.7, seed=i) for i, m in enumerate(names)})
    pool = write_pool_file(tmp_path / "pool.yaml", server, names)
    if priced:
        pool.write_text(
            pool.read_text().replace("}", ", input_cost_per_token: 1.0e-7, output_cost_per_token: 2.0e-7}")
        )
    else:  # a first audit looks the members' price up in LiteLLM's map (loading it); the cache remembers it
        assert "litellm" in audit_recording_modules(tmp_path, pool, "first", limit=2)
    loaded = audit_recording_modules(tmp_path, pool, "audit")
    assert "langgraph" in loaded and "yaml" in loaded  # (what the command needs is there)
    assert [name for name in NOT_BEFORE_THE_FIRST_REQUEST if name in loaded] == []
