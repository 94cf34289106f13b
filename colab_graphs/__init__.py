"""colab-graphs: measure and train language models for what they add to a team of models.

The public API is re-exported here lazily (attribute access imports the submodule), so `import colab_graphs`
stays instant and heavy packages load only when used.
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

_EXPORTS = {
    "Pool": "colab_graphs.pool",
    "Member": "colab_graphs.pool",
    "PoolError": "colab_graphs.pool",
    "GraphSpec": "colab_graphs.spec",
    "Seat": "colab_graphs.spec",
    "Aggregate": "colab_graphs.spec",
    "LogitSeat": "colab_graphs.spec",
    "SpecError": "colab_graphs.spec",
    "START": "colab_graphs.spec",
    "END": "colab_graphs.spec",
    "GraphBuilder": "colab_graphs.builder",
    "compile_graph": "colab_graphs.compile",
    "restrict": "colab_graphs.coalition",
    "ModelClient": "colab_graphs.models.client",
    "CallError": "colab_graphs.models.client",
    "CallCache": "colab_graphs.models.cache",
    "Trace": "colab_graphs.trace",
    "Call": "colab_graphs.trace",
    "run_dataset": "colab_graphs.runner",
    "Example": "colab_graphs.data.example",
    "register_scorer": "colab_graphs.data.scoring",
    "get_scorer": "colab_graphs.data.scoring",
    "aggregator": "colab_graphs.aggregators",
    "router": "colab_graphs.aggregators",
    "protocol": "colab_graphs.protocols.registry",
    "build_protocol": "colab_graphs.protocols.registry",
    "list_protocols": "colab_graphs.protocols.registry",
}

__all__ = sorted(_EXPORTS) + ["__version__"]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'colab_graphs' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
