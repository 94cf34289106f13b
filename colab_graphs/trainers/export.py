"""Export the trained policy as a plain Hugging Face folder.

The folder loads with `AutoModelForCausalLM.from_pretrained(folder)` / `AutoTokenizer.from_pretrained(folder)`,
so `colab-graphs serve`, vLLM and the zoo (`local/<folder path>`) can all serve it. A LoRA adapter is merged
into the weights; `colab_graphs_policy.json` records where the policy came from.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from colab_graphs.files import atomic_write_text
from colab_graphs.redaction import hide_secrets

MANIFEST = "colab_graphs_policy.json"


def export_policy(model: Any, tokenizer: Any, folder: str | Path, info: dict[str, Any] | None = None) -> Path:
    """Save `model` (LoRA merged) and `tokenizer` to `folder`; returns the folder.

    Args:
        model: a transformers causal LM or a PEFT model wrapping one.
        tokenizer: its tokenizer (chat template included).
        folder: destination (created).
        info: provenance written to `colab_graphs_policy.json` (config, steps, evaluation).
    """
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    if hasattr(model, "merge_and_unload"):
        model = model.merge_and_unload()
    # Training with gradient checkpointing switches the KV cache off in the config; a served model wants it.
    model.config.use_cache = True
    model.save_pretrained(folder, safe_serialization=True)
    tokenizer.save_pretrained(folder)
    atomic_write_text(folder / MANIFEST, hide_secrets(json.dumps(info or {}, indent=2, default=str) + "\n"))
    return folder
