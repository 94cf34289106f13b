"""What this machine gives the sandbox (`colab-graphs doctor`): each backend, the `auto` choice, the interpreter.

`diagnose()` returns one JSON-ready mapping:

- ``backends``: namespaces / landlock / unsafe-local -> ``{"available", "safe", "why_not"}`` (the reasons
  `colab_graphs.sandbox.availability` gives);
- ``auto``: the backend ``auto`` chooses here, or None with ``auto_refusal`` (what a code-scored run is told);
- ``setting``: env `COLAB_GRAPHS_SANDBOX` (what a command uses without ``--sandbox``) and the backend it gets;
- ``interpreter``: the Python the sandboxed code runs, whether it is this environment's (its packages) and
  whether the sandbox's uid can run it (tried as that uid, not decided from permission bits);
- ``packages``: the allow-list of packages the code sees (`colab_graphs.sandbox.visible`), or why it is refused;
- ``landlock_abi``: the kernel's Landlock ABI version (None with the reason);
- ``user_namespaces``: the kernel's switches for them and whether this process can create one now.

Nothing here runs model-written code; the interpreter check runs ``python -c`` as the sandbox uid when root.
"""

from __future__ import annotations

import ctypes
import errno
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

from colab_graphs.sandbox import SandboxUnavailable, availability, backends, resolve

_LANDLOCK_CREATE_RULESET = 444  # the same number on x86_64 and aarch64 (syscalls added after 5.x are shared)
_LANDLOCK_CREATE_RULESET_VERSION = 1
_SYSCTLS = (
    "/proc/sys/user/max_user_namespaces",
    "/proc/sys/kernel/unprivileged_userns_clone",
    "/proc/sys/kernel/apparmor_restrict_unprivileged_userns",
)


def diagnose() -> dict[str, Any]:
    """The machine's sandbox facts (see the module docstring)."""
    why_not = availability()
    found: dict[str, Any] = {
        name: {"available": reason is None, "safe": True, "why_not": reason}
        for name, reason in why_not.items()
    }
    found["unsafe-local"] = {"available": True, "safe": False, "why_not": None}
    auto, refusal = _backend("auto")
    env = os.environ.get(backends.ENV) or None
    chosen, chosen_refusal = _backend(env or "auto")
    return {
        "backends": found,
        "auto": auto,
        "auto_refusal": refusal,
        "setting": {"env": env, "backend": chosen, "refusal": chosen_refusal},
        "interpreter": interpreter()
        if auto is not None
        else {"path": None, "reachable": False, "problem": None},
        "packages": packages(),
        "landlock_abi": landlock_abi(),
        "user_namespaces": user_namespaces(),
        "euid": os.geteuid(),
    }


def safe_backend(found: dict[str, Any]) -> bool:
    """Whether `diagnose()` found a safe backend (`colab-graphs doctor` exits 0 then)."""
    return found["auto"] is not None


def _backend(setting: str) -> tuple[str | None, str | None]:
    from colab_graphs.sandbox.scope import normalize

    try:
        return resolve(normalize(setting)).name, None
    except (SandboxUnavailable, ValueError) as err:
        return None, str(err)


def interpreter(backend: str | None = None) -> dict[str, Any]:
    """The sandbox's Python: its path, whether it is this environment's, and whether it runs *inside* the
    sandbox of `backend` (None: the one `auto` picks), tried with a real sandboxed run that prints its version
    and which of this environment's packages import there (a venv behind a mode-700 directory is reachable
    through the backend even where the sandbox's uid could not run it directly)."""
    from colab_graphs.sandbox import runner

    try:
        path = runner.sandbox_python()
    except SandboxUnavailable as err:
        return {"path": None, "this_environment": False, "reachable": False, "problem": str(err)}
    ours = os.path.realpath(path) == os.path.realpath(sys.executable)
    result: dict[str, Any] = {"path": path, "this_environment": ours, "this_python": sys.executable}
    probe = (
        "import importlib.util, sys\n"
        "print('%d.%d.%d' % sys.version_info[:3])\n"
        "print(','.join(m for m in ('numpy', 'pandas') if importlib.util.find_spec(m)))\n"
    )
    try:
        done = runner.run_code(probe, timeout_s=30, backend=backend)
    except SandboxUnavailable as err:
        return {**result, "reachable": False, "problem": str(err)}
    lines = done.stdout.splitlines()
    reachable = done.passed and bool(lines)
    result |= {"reachable": reachable, "backend": done.backend, "version": lines[0] if reachable else None}
    result["packages"] = [m for m in lines[1].split(",") if m] if reachable and len(lines) > 1 else []
    if not reachable:
        result["problem"] = (
            f"{path} does not run in the {done.backend} sandbox: {done.stderr.strip()[-300:]} "
            "(set COLAB_GRAPHS_SANDBOX_PYTHON to an interpreter that does)"
        )
    elif not ours:
        result["problem"] = (
            f"the sandbox runs {path}, not this environment's {sys.executable}: code needing this "
            "environment's packages (numpy, ...) fails there"
        )
    else:
        result["problem"] = None
    return result


def packages() -> dict[str, Any]:
    """The packages sandboxed code may import and read (the rest of the environment is hidden from it)."""
    from colab_graphs.sandbox import visible

    try:
        return {"allowed": list(visible.allowed_packages()), "env": visible.PACKAGES_ENV, "problem": None}
    except SandboxUnavailable as err:
        return {"allowed": [], "env": visible.PACKAGES_ENV, "problem": str(err)}


def landlock_abi() -> dict[str, Any]:
    """The kernel's Landlock ABI (`landlock_create_ruleset(NULL, 0, VERSION)`), or why there is none."""
    if sys.platform != "linux":
        return {"abi": None, "why_not": f"Landlock is Linux's; this is {sys.platform}"}
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    value = libc.syscall(
        ctypes.c_long(_LANDLOCK_CREATE_RULESET), None, ctypes.c_size_t(0), ctypes.c_uint32(1)
    )
    if value >= 0:
        return {"abi": int(value), "why_not": None}
    code = ctypes.get_errno()
    reasons = {
        errno.ENOSYS: "the kernel has no Landlock (older than 5.13), or a seccomp filter refuses it",
        errno.EOPNOTSUPP: "Landlock is built in but not enabled (add landlock to the lsm= boot parameter)",
    }
    return {"abi": None, "why_not": reasons.get(code, os.strerror(code))}


def user_namespaces() -> dict[str, Any]:
    """The kernel's user-namespace switches (where present) and whether this process can create one now."""
    sysctls = {}
    for name in _SYSCTLS:
        path = Path(name)
        if path.exists():
            try:
                sysctls[path.name] = path.read_text().strip()
            except OSError as err:
                sysctls[path.name] = f"unreadable: {err.strerror}"
    unshare = shutil.which("unshare")
    if unshare is None:
        return {"sysctls": sysctls, "can_create": False, "why_not": "no unshare binary (util-linux)"}
    argv = [unshare, "--user", *(["--map-root-user"] if os.geteuid() != 0 else []), "true"]
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=10, cwd="/")
    except (OSError, subprocess.SubprocessError) as err:
        return {"sysctls": sysctls, "can_create": False, "why_not": str(err)}
    why = None if done.returncode == 0 else (done.stderr.strip()[-300:] or f"exit {done.returncode}")
    return {"sysctls": sysctls, "can_create": done.returncode == 0, "why_not": why}


def render(found: dict[str, Any]) -> list[str]:
    """`diagnose()` as the lines `colab-graphs doctor` prints."""
    lines = ["sandbox backends:"]
    for name, b in found["backends"].items():
        state = "available" if b["available"] else f"unavailable: {b['why_not']}"
        lines.append(f"  {name:<13} {state}{'' if b['safe'] else ' (unsafe: explicit opt-in only)'}")
    if found["auto"]:
        lines.append(f"auto chooses: {found['auto']}")
    else:
        lines.append(f"auto chooses: nothing; a code-scored run is refused (exit 6): {found['auto_refusal']}")
    setting = found["setting"]
    if setting["env"]:
        got = setting["backend"] or f"refused: {setting['refusal']}"
        lines.append(f"{backends.ENV}={setting['env']}: {got}")
    py = found["interpreter"]
    if py.get("backend"):
        runs = "runs" if py.get("reachable") else "does NOT run"
        packages = ", ".join(py.get("packages") or []) or "none of numpy, pandas"
        how = f"{runs} in the {py['backend']} sandbox; version {py.get('version') or '?'}; imports {packages}"
    else:
        how = "not tried: no safe sandbox to run it in"
    lines.append(f"interpreter: {py.get('path') or runner_python()} ({how})")
    if py.get("problem"):
        lines.append(f"  note: {py['problem']}")
    allowed = found["packages"]
    listed = ", ".join(allowed["allowed"]) or "none (standard library only)"
    lines.append(f"packages the code sees: {listed} ({allowed['env']} changes it)")
    if allowed["problem"]:
        lines.append(f"  note: {allowed['problem']}")
    abi = found["landlock_abi"]
    lines.append(f"landlock ABI: {abi['abi']}" if abi["abi"] is not None else f"landlock: {abi['why_not']}")
    ns = found["user_namespaces"]
    switches = ", ".join(f"{k}={v}" for k, v in ns["sysctls"].items()) or "none found"
    can = "yes" if ns["can_create"] else f"no ({ns['why_not']})"
    lines.append(f"user namespaces: can create one now: {can}; sysctls: {switches}")
    return lines


def runner_python() -> str:
    """The interpreter sandboxed code would run on (named even where no sandbox can run it)."""
    from colab_graphs.sandbox import runner

    try:
        return runner.sandbox_python()
    except SandboxUnavailable as err:
        return f"unknown ({err})"
