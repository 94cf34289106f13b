"""Test doubles that speak real protocols: a scripted OpenAI-compatible server and ready-made member scripts.

The member scripts are imported here; the server's names are loaded on first use, so that
`python -m colab_graphs.testing.server` does not import that module twice.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from colab_graphs.testing.scripts import (
    SCRIPTS,
    Member,
    Reply,
    Script,
    ToolCall,
    answer_key,
    arithmetic_solver,
    constant,
    echo,
    load_members,
    member_from_config,
)

if TYPE_CHECKING:
    from colab_graphs.testing.server import FAULT_KINDS, RequestKey, RequestRecord, ScriptedServer

_SERVER_NAMES = ("FAULT_KINDS", "RequestKey", "RequestRecord", "ScriptedServer")

__all__ = [
    "FAULT_KINDS",
    "SCRIPTS",
    "Member",
    "RequestKey",
    "Reply",
    "RequestRecord",
    "Script",
    "ScriptedServer",
    "ToolCall",
    "answer_key",
    "arithmetic_solver",
    "constant",
    "echo",
    "load_members",
    "member_from_config",
]


def __getattr__(name: str) -> Any:
    if name in _SERVER_NAMES:
        return getattr(importlib.import_module("colab_graphs.testing.server"), name)
    raise AttributeError(f"module 'colab_graphs.testing' has no attribute {name!r}")
