"""Which model answers a member's calls: the identity the call cache keys on beside the request.

The request (model name, messages, sampling settings) says what was asked; it does not say who answered. Two
servers that both serve a model named `ada`, a policy retrained and served again under its old name, a pool
moved from one vLLM server to another: each asks the same request of another model. So the cache key carries
the member's identity too:

- a member with `cache_namespace:` is that namespace, and nothing else: members that declare one namespace
  share entries wherever they are served (one model moved to another server), and bumping it (``v1`` -> ``v2``
  for a retrained policy) starts afresh;
- a member over `deployments` is the set of its deployments' endpoints (order and routing limits aside), so its
  replicas share entries, whichever one answered;
- an in-process `local/...` member is the identity of its weights: a zoo model's name and pinned source hash,
  a model folder's content hash (config, weights, tokenizer and chat template; a policy saved again to the same
  folder is another model), a LoRA adapter's with its base's, a model served from memory
  (`set_local_model`) a token that changes whenever its weights are swapped;
- any other member is its endpoint: the `api_base` normalised (scheme and host lower-cased, default port,
  trailing slash, userinfo and query string dropped: an identity holds no secret), else its provider
  (``openai``, ``anthropic``: a hosted API is one endpoint).

Connection details that do not change who answers (`api_key`, `timeout`, headers) stay out, as before.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit

from colab_graphs.pool import Member

_DEFAULT_PORTS = {"http": 80, "https": 443}


def cache_identity(member: Member, settings: Mapping[str, Any] | None = None) -> str:
    """The identity of the model that answers `member`'s calls made with `settings` (default: its own)."""
    if member.cache_namespace:
        return f"namespace:{member.cache_namespace}"
    settings = member.settings if settings is None else settings
    if member.deployments:
        endpoints = sorted({endpoint_identity({**settings, **d}) for d in member.deployments})
        return "deployments:" + ",".join(endpoints)
    if str(settings.get("model", "")).startswith("local/"):
        return "local:" + local_identity(settings)
    return endpoint_identity(settings)


def endpoint_identity(settings: Mapping[str, Any]) -> str:
    """``endpoint:<normalised api_base>``, else ``provider:<name>`` for a hosted API."""
    base = settings.get("api_base") or settings.get("base_url")
    if base:
        return "endpoint:" + normalise_url(str(base))
    provider = settings.get("custom_llm_provider")
    model = str(settings.get("model", ""))
    return "provider:" + str(provider or (model.split("/", 1)[0] if "/" in model else model))


@functools.lru_cache(maxsize=1024)
def normalise_url(url: str) -> str:
    """`url` as an identity: scheme and host lower-cased, default port and trailing slashes dropped, and
    no userinfo, query or fragment (where keys travel)."""
    try:
        parts = urlsplit(url.strip())
        port = parts.port
    except ValueError:
        return url.strip().rstrip("/")
    scheme = parts.scheme.lower()
    host = (parts.hostname or "").lower()
    if ":" in host:
        host = f"[{host}]"  # IPv6
    netloc = host if port in (None, _DEFAULT_PORTS.get(scheme)) else f"{host}:{port}"
    return f"{scheme}://{netloc}{parts.path.rstrip('/')}"


def local_identity(settings: Mapping[str, Any]) -> str:
    """The weights behind a ``local/`` model, with those of the members a logit-level mode mixes in (the
    provider says what it would load: `colab_graphs.local.provider.weights_identity`)."""
    from colab_graphs.local.provider import weights_identity

    ident = weights_identity(str(settings["model"]))
    mode = settings.get("colab_graphs")
    if not isinstance(mode, Mapping):
        metadata = settings.get("metadata")
        mode = metadata.get("colab_graphs") if isinstance(metadata, Mapping) else None
    others = mode.get("members") if isinstance(mode, Mapping) else None
    if others:
        ident += "+" + ",".join(weights_identity(str(m)) for m in others)
    return ident
