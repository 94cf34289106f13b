"""Secrets never reach a file or a terminal: one redactor that knows the pool's secret values.

A secret is any value a pool file gives in `api_key`, in an `extra_headers` / `headers` mapping, in the userinfo
or query string of an `api_base` / `base_url` (``https://user:pass@host/v1?key=...``), and any value read from
the environment (``${ENV}``). Loading a pool registers its secrets here (`register`); every writer (traces, the
log, results, summaries, reports, the call cache's stored requests, errors printed by the CLI) passes its text
through `redact`, which replaces each registered value wherever it occurs, so a provider that echoes a header or
the request URL in an error body is caught as surely as the field that holds it (`hide_secrets` for whole
records, `redact` for error texts, which also removes key-shaped strings no pool named).

Redaction is by value, not by field name: a key is found in any text, under any name. Values shorter than
`MIN_SECRET_CHARS` are removed from the fields that hold them (`public_value`) but not searched for in free text:
a placeholder key such as ``EMPTY`` or a port read from the environment would otherwise be cut out of every
prompt and reply that happens to contain the word. A value read from the environment is written as its
reference (``${VLLM_URL}``), so a report still says where the value came from.
"""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Iterable, Mapping
from typing import Any
from urllib.parse import SplitResult, parse_qsl, quote, unquote, urlsplit

REDACTED = "[REDACTED]"
MIN_SECRET_CHARS = 8
SECRET_FIELDS = frozenset({"api_key", "extra_headers", "headers"})
URL_FIELDS = frozenset({"api_base", "base_url"})

# Key-shaped strings worth removing from error texts even when no pool named them (a provider's own message).
_KEY_PATTERNS = [
    re.compile(r"sk-[A-Za-z0-9_\-]{8,}"),
    re.compile(r"AKIA[0-9A-Z]{16}"),
    re.compile(r"(?i)(bearer\s+)[A-Za-z0-9._\-]{8,}"),
]


class Redactor:
    """Secret values -> what is written instead (`REDACTED`, or ``${VAR}`` for a value from the environment)."""

    def __init__(self) -> None:
        self._values: dict[str, str] = {}
        self._lock = threading.Lock()

    def add(self, value: str, replacement: str = REDACTED) -> None:
        """Remember `value` (and its JSON-escaped and URL-quoted forms, as files and URLs would hold it)."""
        if len(value) < MIN_SECRET_CHARS:
            return
        forms = {
            value,
            json.dumps(value, ensure_ascii=False)[1:-1],
            json.dumps(value)[1:-1],
            quote(value, safe=""),
        }
        with self._lock:
            for form in forms:
                if replacement != REDACTED or form not in self._values:  # a ${VAR} reference says more
                    self._values[form] = replacement

    def text(self, text: str) -> str:
        """`text` with every registered value replaced (longest first, so no value is left half-replaced)."""
        if not self._values or not text:
            return text
        for value in sorted(self._values, key=len, reverse=True):
            if value in text:
                text = text.replace(value, self._values[value])
        return text

    def clear(self) -> None:
        with self._lock:
            self._values.clear()

    def __len__(self) -> int:
        return len(self._values)


SECRETS = Redactor()  # this process's: every pool loaded registers its members' secrets here


def hide_secrets(text: str) -> str:
    """`text` without the registered secrets: what every writer of a file applies to what it writes."""
    return SECRETS.text(text)


def redact(text: str, secrets: Iterable[str] = ()) -> str:
    """An error text without the registered secrets, the `secrets` given (any of 4 characters or more) and
    key-shaped strings (``sk-...``, AWS key ids, bearer tokens) that a provider's own message may carry.

    Key shapes are looked for in error texts only: in prompts and replies they would cut ordinary words
    ("bearer instruments").
    """
    for secret in secrets:
        if secret and len(secret) >= 4:
            text = text.replace(secret, REDACTED)
    text = SECRETS.text(text)
    for pattern in _KEY_PATTERNS:
        text = pattern.sub(lambda m: (m.group(1) if m.groups() else "") + REDACTED, text)
    return text


def url_secrets(url: str) -> list[str]:
    """The secret parts of a URL: its userinfo (user and password) and its query values."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return []
    found = []
    if parts.username:
        found += [parts.username, unquote(parts.username)]
    if parts.password:
        found += [parts.password, unquote(parts.password)]
    for _, value in parse_qsl(parts.query, keep_blank_values=False):
        found += [value, quote(value, safe="")]
    return [v for v in found if v]


def public_url(url: str) -> str:
    """`url` with its userinfo and query values replaced (``https://[REDACTED]@host/v1?key=[REDACTED]``)."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return REDACTED
    netloc = parts.netloc
    if "@" in netloc:
        netloc = f"{REDACTED}@{netloc.rsplit('@', 1)[1]}"
    query = "&".join(f"{k}={REDACTED}" for k, _ in parse_qsl(parts.query, keep_blank_values=True))
    return SplitResult(parts.scheme, netloc, parts.path, query, "").geturl()


def settings_secrets(settings: Mapping[str, Any]) -> list[str]:
    """The secret values one member's (or deployment's) settings hold, by field: keys, headers, URL parts."""
    found: list[str] = []
    key = settings.get("api_key")
    if key:
        found.append(str(key))
    for field in ("extra_headers", "headers"):
        headers = settings.get(field)
        if isinstance(headers, Mapping):
            found += [str(v) for v in headers.values() if v]
    for field in URL_FIELDS:
        url = settings.get(field)
        if isinstance(url, str):
            found += url_secrets(url)
    return found


def public_value(value: Any, env_refs: Mapping[str, str]) -> Any:
    """`value` as it may be written: a string read from the environment becomes its ``${VAR}`` reference, and
    environment values inside a longer string are replaced by theirs (`env_refs`: value -> reference)."""
    if isinstance(value, str):
        if value in env_refs:
            return env_refs[value]
        for secret in sorted(env_refs, key=len, reverse=True):
            if len(secret) >= MIN_SECRET_CHARS and secret in value:
                value = value.replace(secret, env_refs[secret])
        return value
    if isinstance(value, Mapping):
        return {k: public_value(v, env_refs) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [public_value(v, env_refs) for v in value]
    return value


def public_settings(settings: Mapping[str, Any], env_refs: Mapping[str, str]) -> dict[str, Any]:
    """Settings safe to write: keys and headers left out, URL secrets and environment values replaced."""
    out: dict[str, Any] = {}
    for field, value in settings.items():
        if field in SECRET_FIELDS:
            continue
        value = public_value(value, env_refs)
        if field in URL_FIELDS and isinstance(value, str):
            value = public_url(value)
        out[field] = value
    return out
