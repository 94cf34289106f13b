"""Which sandbox setting a command's code scores run under, checked before the first model call, and its record.

The setting travels in a context variable: `using(setting)` sets it for everything that runs inside (the
tasks an event loop starts copy it, and `colab_graphs.trainers.rollout.LoopThread` hands it to its loop), and
`CodeTask.score` reads it (`current()`) and passes it to `arun_tests(..., sandbox=)`. So the setting is given
once, where a command or library call starts (`--sandbox`, a study's or training config's `sandbox:`, the
`sandbox=` argument of `run_dataset`, `play_audit`, `play_study`), and reaches every code score of every
protocol, fit, game and rollout without a parameter on each. Unset, it is env `COLAB_GRAPHS_SANDBOX`, else
``auto``. A study's Ray workers get it with the plan (`StudyPlan.sandbox`), and each process of a training
reads it from the config.

Fail closed: `require(examples, scorer)` is called before any model call. When any example is scored by code,
it resolves the setting (`colab_graphs.sandbox.resolve`: `SandboxUnavailable` names what is missing and the
ways out) and runs one known-good answer in that backend (`probe`), so a backend that resolves but cannot run
here (an interpreter its uid cannot reach, say) is refused too, before anything is spent; it returns the
record every output writes (`summary.json`, `report.json`, `study.json`, the training summary and metrics):
the setting, the backend, whether it is safe, and the isolation the backend applied. ``unsafe-local`` is
accepted only when named; it logs a warning once per process and is written into that record. Commands with
no code-scored example neither resolve nor record anything.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import logging
import os
from collections.abc import Iterable, Iterator
from typing import Any

from colab_graphs.sandbox import backends

logger = logging.getLogger(__name__)

ALIASES = {"unsafe": "unsafe-local"}
CHOICES = (*backends.SETTINGS, *ALIASES)  # what `--sandbox` and a config's `sandbox:` accept
EXIT_CODE = 6  # the CLI's exit status when code cannot be scored under the setting (nothing was called)

_SETTING: contextvars.ContextVar[str | None] = contextvars.ContextVar("colab_graphs_sandbox", default=None)


def normalize(setting: str | None) -> str | None:
    """`setting` as one of `backends.SETTINGS` (``unsafe`` is ``unsafe-local``); None stays None.

    Raises:
        ValueError: not a setting (the message lists them).
    """
    if setting is None:
        return None
    value = ALIASES.get(setting.strip(), setting.strip())
    if value not in backends.SETTINGS:
        raise ValueError(f"{setting!r} is not a sandbox setting; use one of {', '.join(CHOICES)}")
    return value


def current() -> str:
    """The setting in force here: the innermost `using`, else env `COLAB_GRAPHS_SANDBOX`, else ``auto``.

    Raises:
        SandboxUnavailable: the environment variable holds no setting.
    """
    explicit = _SETTING.get()
    if explicit:
        return explicit
    env = os.environ.get(backends.ENV, "").strip()
    try:
        return normalize(env) or "auto" if env else "auto"
    except ValueError as err:
        raise backends.SandboxUnavailable(f"{backends.ENV}: {err}") from None


@contextlib.contextmanager
def using(setting: str | None) -> Iterator[str]:
    """Score code under `setting` inside the block (None: keep the one in force); yields the setting in force."""
    if setting is None:
        yield current()
        return
    token = _SETTING.set(normalize(setting))
    try:
        yield current()
    finally:
        _SETTING.reset(token)


@functools.cache
def probe(setting: str) -> dict[str, Any]:
    """The record of `setting` on this machine: resolve it and score one known-good answer in its backend.

    Once per process and setting (a study checks each of its audits). The record is
    ``{"setting", "backend", "safe", "isolation"}``; ``unsafe-local`` logs its warning here, once.
    """
    from colab_graphs.sandbox import resolve
    from colab_graphs.sandbox.code_tests import run_tests

    backend = resolve(setting)
    verdict = run_tests("def probe(x):\n    return x + 1\n", "assert probe(1) == 2\n", sandbox=setting)
    if not verdict.passed:
        raise backends.SandboxUnavailable(
            f"the {backend.name} sandbox was chosen ({setting}) but a known-good answer failed in it: "
            f"{verdict.reason}; see `colab-graphs doctor`"
        )
    if not backend.safe:
        logger.warning(
            "sandbox %s: code the models write runs unconfined, as this user, with this machine's network "
            "and files (no namespaces, no Landlock); every result and report says so",
            backend.name,
        )
    return {
        "setting": setting,
        "backend": verdict.backend or backend.name,
        "safe": backend.safe,
        "isolation": list(verdict.isolation),
    }


def row_record(backend: str, isolation: Iterable[str]) -> dict[str, Any]:
    """What a result row of a code example says of the run that scored it: the backend and its isolation."""
    return {"backend": backend, "isolation": list(isolation)}


def describe(record: dict[str, Any]) -> str:
    """A record in words, for the markdown reports and the terminal: the backend and what it applied."""
    applied = ", ".join(record.get("isolation") or []) or "none"
    if not record.get("safe", True):
        return f"{record.get('backend')} (opted in: the code ran unconfined; applied: {applied})"
    return f"{record.get('backend')} ({applied})"
