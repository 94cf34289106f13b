"""Old import paths of modules that moved, kept working for one release.

`import colab_graphs.data.answers` (an old path) gives the module object of its new path
(`colab_graphs.tasks.answers`), the very same object, and emits a `MovedModuleWarning` naming the new path. A
meta-path finder does it, installed when this module is imported (`colab_graphs` imports it first): nothing is copied, so an old and a new
path never hold two copies of a module (or of its registries and caches). The package's own code uses new paths
only (the test configuration turns this warning into an error).
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys
import warnings
from collections.abc import Sequence
from types import FrameType, ModuleType

# old module name -> new module name; each moved for one release (0.2 drops them).
MOVED: dict[str, str] = {
    "colab_graphs.data": "colab_graphs.tasks",
    "colab_graphs.data.answers": "colab_graphs.tasks.answers",
    "colab_graphs.data.benchmarks": "colab_graphs.tasks.benchmarks",
    "colab_graphs.data.builtin": "colab_graphs.tasks.builtin",
    "colab_graphs.data.checks": "colab_graphs.tasks.checks",
    "colab_graphs.data.example": "colab_graphs.tasks.example",
    "colab_graphs.data.judge": "colab_graphs.tasks.judge",
    "colab_graphs.data.loaders": "colab_graphs.tasks.loaders",
    "colab_graphs.data.scoring": "colab_graphs.tasks.scoring",
    "colab_graphs.data.tasks": "colab_graphs.tasks.task_types",
    # models/ split by concern: the call path stays; in-process inference, the server and the LangChain
    # adapters have packages of their own.
    "colab_graphs.models.local": "colab_graphs.local.provider",
    "colab_graphs.models.local_engine": "colab_graphs.local.local_engine",
    "colab_graphs.models.engines": "colab_graphs.local.engines",
    "colab_graphs.models.logits": "colab_graphs.local.logits",
    "colab_graphs.models.merge": "colab_graphs.local.merge",
    "colab_graphs.models.zoo": "colab_graphs.local.zoo",
    "colab_graphs.models.guided": "colab_graphs.local.guided",
    "colab_graphs.models.json_guide": "colab_graphs.local.json_guide",
    "colab_graphs.models.server": "colab_graphs.serve.server",
    "colab_graphs.models.http": "colab_graphs.serve.http",
    "colab_graphs.models.openai_api": "colab_graphs.serve.openai_api",
    "colab_graphs.models.serve_replies": "colab_graphs.serve.serve_replies",
    "colab_graphs.models.tool_calls": "colab_graphs.serve.tool_calls",
    "colab_graphs.models.chat_model": "colab_graphs.langchain.chat_model",
    "colab_graphs.models.lc": "colab_graphs.langchain.lc",
    "colab_graphs.models.member_chat": "colab_graphs.langchain.member_chat",
    "colab_graphs.models.binding": "colab_graphs.langchain.binding",
}


class MovedModuleWarning(DeprecationWarning):
    """An old import path of a moved module was imported; the message names the new path."""


class _Alias(importlib.abc.Loader):
    def __init__(self, new: str) -> None:
        self.new = new

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        frame = _importer()
        warnings.warn_explicit(
            f"{spec.name} moved to {self.new}; import it from there (the old path goes in the next release)",
            MovedModuleWarning,
            frame.f_code.co_filename,
            frame.f_lineno,
            module=frame.f_globals.get("__name__"),
            registry=frame.f_globals.setdefault("__warningregistry__", {}),
        )  # (no module_globals: its loader would be asked for source lines, and `python -c`'s has none)
        return importlib.import_module(self.new)

    def exec_module(self, module: ModuleType) -> None:
        """Nothing to run: the module ran when its new path was imported."""


def _importer() -> FrameType:
    """The first frame outside the import machinery: the module whose `import` named the old path."""
    frame = sys._getframe(1)
    while frame.f_back is not None and (
        frame.f_code.co_filename.startswith("<frozen importlib")
        or frame.f_code.co_filename in (__file__, importlib.__file__)
    ):
        frame = frame.f_back
    return frame


class _MovedFinder(importlib.abc.MetaPathFinder):
    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        new = MOVED.get(fullname)
        if new is None:
            return None
        package = any(old.startswith(fullname + ".") for old in MOVED)
        return importlib.machinery.ModuleSpec(fullname, _Alias(new), is_package=package)


def install() -> None:
    """Put the finder first on `sys.meta_path` (once): old paths must not reach a stale folder on disk."""
    if not any(isinstance(f, _MovedFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, _MovedFinder())


install()
