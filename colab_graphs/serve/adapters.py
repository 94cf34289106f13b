"""LoRA adapters loaded into `colab-graphs serve` at run time, as vLLM's OpenAI server loads them.

The contract is vLLM's (``vllm/entrypoints/serve/lora/protocol.py`` and ``.../openai/models/serving.py``):
``POST /v1/load_lora_adapter`` takes ``{"lora_name", "lora_path", "load_inplace": false}`` and answers 200
with the text ``Success: LoRA adapter 'NAME' added successfully.``; ``POST /v1/unload_lora_adapter`` takes
``{"lora_name"}`` (``lora_int_id`` is accepted and unused, as vLLM's OpenAI layer leaves it) and answers
``Success: LoRA adapter 'NAME' removed successfully.``. Loading a name already loaded is refused unless
``load_inplace`` is true (then the adapter is replaced: a trainer's policy after each update). A request
whose ``model`` is a loaded adapter's name decodes with that adapter; ``GET /v1/models`` lists each adapter
with ``root`` (its path) and ``parent`` (the base model's name), as vLLM's does. Both routes exist only
when the server was started with ``enable_lora`` (``--enable-lora``; vLLM asks for ``--enable-lora`` and
``VLLM_ALLOW_RUNTIME_LORA_UPDATING=True``): loading reads a folder named by the client.

Here an adapter is merged into its own copy of the served weights (W + s B A for every adapted module, the
exact merge of `colab_graphs.local.merge`), with its own batching engine: requests of one adapter are batched
together and never with another's, and one adapter costs one more copy of the weights (vLLM keeps one base
and applies adapters per row; `max_adapters` bounds the copies). Replacing an adapter swaps the engine a name
maps to: requests already queued on the old engine finish with the old weights, later ones get the new.

Refused with an OpenAI-shaped error naming the fault: a path that is not a folder or holds no
``adapter_config.json`` (404, as vLLM's ``LoRAAdapterNotFoundError``), an adapter that is not plain LoRA, a
module or shape the served model does not have, or a ``base_model_name_or_path`` that is not the served
model's folder or weights (400 ``base_model_mismatch``).
"""

from __future__ import annotations

import copy
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from colab_graphs.local.local_engine import LocalEngine
from colab_graphs.serve.http import RequestError

DEFAULT_MAX_ADAPTERS = 4


class LoadLoRAAdapterRequest(BaseModel):
    """vLLM's ``LoadLoRAAdapterRequest``."""

    model_config = ConfigDict(strict=True, extra="forbid")

    lora_name: str = Field(min_length=1, pattern=r"^\S+$")
    lora_path: str = Field(min_length=1)
    load_inplace: bool = False


class UnloadLoRAAdapterRequest(BaseModel):
    """vLLM's ``UnloadLoRAAdapterRequest``."""

    model_config = ConfigDict(strict=True, extra="forbid")

    lora_name: str = Field(min_length=1)
    lora_int_id: int | None = None


@dataclass(frozen=True)
class Adapter:
    """A loaded adapter: its name, the folder it came from, the engine that decodes with it."""

    name: str
    path: str
    engine: LocalEngine


class Adapters:
    """The adapters a server holds over one base engine (thread-safe: handlers run in worker threads).

    Args:
        base: the engine of the served model.
        base_name: the served model's name (an adapter may not take it).
        base_folder: the served model's folder, to check an adapter's ``base_model_name_or_path`` against
            (None: the server was given a model in memory, and adapters are refused).
        max_adapters: most adapters held at once (each is a copy of the weights).
    """

    def __init__(
        self,
        base: LocalEngine,
        base_name: str,
        base_folder: Path | None,
        max_adapters: int = DEFAULT_MAX_ADAPTERS,
    ) -> None:
        if max_adapters < 1:
            raise ValueError(f"max_adapters must be at least 1, got {max_adapters}")
        self.base, self.base_name, self.base_folder = base, base_name, base_folder
        self.max_adapters = max_adapters
        self._held: dict[str, Adapter] = {}
        self._lock = threading.Lock()  # one load or unload at a time: each may hold a copy of the weights

    def get(self, name: str) -> Adapter | None:
        return self._held.get(name)

    def listed(self) -> list[Adapter]:
        return list(self._held.values())

    def load(self, request: LoadLoRAAdapterRequest) -> str:
        """Load (or with ``load_inplace`` replace) an adapter; vLLM's success text, or `RequestError`."""
        name = request.lora_name
        if name == self.base_name:
            raise RequestError(
                f"lora_name {name!r} is the served model's own name; give the adapter another",
                param="lora_name",
                code="invalid_adapter",
            )
        with self._lock:
            old = self._held.get(name)
            if old is not None and not request.load_inplace:
                # vLLM's words (OpenAIServingModels._check_load_lora_adapter_request)
                raise RequestError(
                    f"The lora adapter '{name}' has already been loaded. If you want to load the adapter in "
                    "place, set 'load_inplace' to True.",
                    param="lora_name",
                    code="adapter_exists",
                )
            if old is None and len(self._held) >= self.max_adapters:
                raise RequestError(
                    f"this server holds at most {self.max_adapters} adapters ({', '.join(self._held)}); "
                    "unload one first (each adapter is a copy of the weights here)",
                    param="lora_name",
                    code="too_many_adapters",
                )
            folder = self._folder(request.lora_path)
            engine = LocalEngine(self._merged(folder), self.base.tokenizer, name=name)
            self._held[name] = Adapter(name, str(folder), engine)
        if old is not None:
            old.engine.close()  # after the requests queued on it: they finish with the weights they asked
        return f"Success: LoRA adapter '{name}' added successfully."

    def unload(self, request: UnloadLoRAAdapterRequest) -> str:
        with self._lock:
            gone = self._held.pop(request.lora_name, None)
        if gone is None:
            raise RequestError(
                f"The lora adapter '{request.lora_name}' cannot be found.",
                param="lora_name",
                code="adapter_not_found",
                status=404,
            )
        gone.engine.close()
        return f"Success: LoRA adapter '{request.lora_name}' removed successfully."

    def close(self) -> None:
        with self._lock:
            for adapter in self._held.values():
                adapter.engine.close()
            self._held.clear()

    # --- checks and the merge -----------------------------------------------------------------------------

    def _folder(self, path: str) -> Path:
        from colab_graphs.local.merge import ADAPTER_CONFIG

        folder = Path(path).expanduser()
        if not folder.is_dir() or not (folder / ADAPTER_CONFIG).is_file():
            what = "is not a folder" if not folder.is_dir() else f"holds no {ADAPTER_CONFIG}"
            raise RequestError(
                f"No adapter found for {path}: it {what} (a PEFT LoRA adapter folder, as save_pretrained writes)",
                param="lora_path",
                code="adapter_not_found",
                status=404,
            )
        return folder.resolve()

    def _merged(self, folder: Path) -> Any:
        """A copy of the served model with the adapter in `folder` merged in."""
        import torch

        from colab_graphs.local.merge import MergeError, adapter_config, load_state, lora_deltas

        try:
            config = adapter_config(folder)
            state = load_state(folder)
        except (MergeError, OSError, ValueError) as err:
            raise RequestError(
                f"cannot load the adapter: {err}", param="lora_path", code="invalid_adapter"
            ) from None
        self._check_base(folder, config)
        model = copy.deepcopy(self.base.model)
        weights = dict(model.named_parameters())
        with torch.no_grad():
            for key, target, delta in lora_deltas(state, config):
                weight = weights.get(target)
                if weight is None or weight.shape != delta.shape:
                    found = "no such weight" if weight is None else f"shape {tuple(weight.shape)}"
                    raise RequestError(
                        f"the adapter does not fit {self.base_name}: its module {key} changes {target} by "
                        f"{tuple(delta.shape)}, and the served model has {found}",
                        param="lora_path",
                        code="base_model_mismatch",
                    )
                weight.add_(delta.to(weight.device, weight.dtype))
        return model.eval()

    def _check_base(self, folder: Path, config: dict[str, Any]) -> None:
        from colab_graphs.local.merge import identity, model_folder

        if self.base_folder is None:
            raise RequestError(
                "this server serves a model held in memory, whose folder it does not know: adapters cannot be "
                "checked against it, so none are loaded",
                param="lora_path",
                code="invalid_adapter",
            )
        named = config.get("base_model_name_or_path")
        if not named:
            return  # PEFT always writes it; an adapter without one is checked by its modules and shapes alone
        try:
            base = model_folder(str(named))
        except (FileNotFoundError, KeyError, ValueError, OSError) as err:
            raise RequestError(
                f"the adapter was trained on {named!r}, which this server cannot find ({err}); it serves "
                f"{self.base_name} from {self.base_folder}",
                param="lora_path",
                code="base_model_mismatch",
            ) from None
        if base.resolve() != self.base_folder.resolve() and identity(base) != identity(self.base_folder):
            raise RequestError(
                f"the adapter was trained on {named!r} ({base}), not on the served model {self.base_name} "
                f"({self.base_folder}): their weights differ",
                param="lora_path",
                code="base_model_mismatch",
            )
