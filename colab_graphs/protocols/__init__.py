"""The built-in protocol library, one module per family. Look protocols up by name with `get_protocol`."""

from colab_graphs.protocols.registry import build_protocol, get_protocol, list_protocols, protocol

__all__ = ["build_protocol", "get_protocol", "list_protocols", "protocol"]
