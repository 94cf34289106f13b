"""Which containment a code score gets: the backends, what each needs of the machine, and the user's setting.

A setting (`--sandbox`, a task's or pool's `sandbox:`, env `COLAB_GRAPHS_SANDBOX`) is one of:

- ``auto`` (the default): the strongest backend this machine gives; none: `SandboxUnavailable`.
- ``namespaces``: user, mount, PID, IPC and network namespaces with a private read-only root (`unshare`).
- ``landlock``: no namespaces needed: Landlock (filesystem) plus a seccomp filter (sockets, ptrace, ...).
- ``unsafe-local``: the code runs as a plain subprocess with rlimits only. An explicit opt-in, recorded in
  every result and report; never chosen by ``auto``.

`colab_graphs.sandbox.runner.resolve(setting)` answers before the first model call, so a refusal costs nothing.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

SETTINGS = ("auto", "namespaces", "landlock", "unsafe-local")
ENV = "COLAB_GRAPHS_SANDBOX"


class SandboxUnavailable(RuntimeError):
    """No backend meets the setting here; the message names what is missing and the ways out."""


@dataclass(frozen=True)
class Backend:
    name: str  # one of SETTINGS but "auto"
    safe: bool  # False only for "unsafe-local"


def setting_from_env() -> str:
    value = os.environ.get(ENV, "auto").strip() or "auto"
    if value not in SETTINGS:
        raise SandboxUnavailable(
            f"{ENV}={value!r} is not a sandbox setting; use one of {', '.join(SETTINGS)}"
        )
    return value
