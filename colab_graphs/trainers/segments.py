"""A generation batch's policy segments as TRL's padded batch, and the passes it is trained in.

Depends on torch only (no TRL, LiteLLM or LangGraph), so that `bench/gpu_check.py` runs the trainer's own
batching on a machine that has nothing else; `colab_graphs.trainers.grpo` explains the layout.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from colab_graphs.trainers.rollout import PolicyTurn


@dataclass(frozen=True)
class BatchLayout:
    """How one process's generation batch is cut: `rows` rows in all (segments, then padding rows), trained
    in passes of `pass_rows` rows."""

    rows: int
    pass_rows: int


def batch_layout(most_segments: int, steps_per_generation: int, max_pass_rows: int) -> BatchLayout:
    """The layout every process uses, from the largest segment count of any process.

    Each of the `steps_per_generation` micro-batches gets the same number of passes of the same size, at
    most `max_pass_rows`, with as little padding as that allows.

    Example:
        >>> batch_layout(10, 1, 4)  # 10 segments, passes of at most 4: three passes of 4
        BatchLayout(rows=12, pass_rows=4)
        >>> batch_layout(9, 1, 8)  # two passes of 5 waste less than a pass of 8 and one of 1
        BatchLayout(rows=10, pass_rows=5)
        >>> batch_layout(0, 2, 4)  # no segment anywhere: one empty row per micro-batch
        BatchLayout(rows=2, pass_rows=1)
    """
    per_step = max(1, math.ceil(most_segments / steps_per_generation))
    passes = math.ceil(per_step / max_pass_rows)
    pass_rows = math.ceil(per_step / passes)
    return BatchLayout(steps_per_generation * passes * pass_rows, pass_rows)


def segment_batch(
    segments: Sequence[tuple[PolicyTurn, float]], pad_id: int, rows: int | None = None, device: Any = "cpu"
) -> dict[str, torch.Tensor]:
    """Pad policy segments into TRL's batch layout (prompts left-padded, completions right-padded).

    A segment is anything with `prompt_ids` and `completion_ids` (a `PolicyTurn`), with its advantage.

    Rows are added (all-masked, advantage 0) up to `rows` (default: one row per segment, at least one).
    `num_items_in_batch` is this batch's count of policy tokens; `CRLTrainer` replaces it by the count over
    all processes.
    """
    out = [(list(t.prompt_ids), list(t.completion_ids), float(a)) for t, a in segments]
    if rows is not None and rows < len(out):
        raise ValueError(f"{len(out)} segments do not fit in {rows} rows")
    while len(out) < max(rows or 0, 1):
        out.append(([pad_id], [pad_id], None))  # type: ignore[arg-type]
    p_len = max(len(p) for p, _, _ in out)
    c_len = max(len(c) for _, c, _ in out)
    prompt_ids = torch.full((len(out), p_len), pad_id, dtype=torch.long)
    prompt_mask = torch.zeros((len(out), p_len), dtype=torch.long)
    completion_ids = torch.full((len(out), c_len), pad_id, dtype=torch.long)
    completion_mask = torch.zeros((len(out), c_len), dtype=torch.long)
    advantages = torch.zeros(len(out))
    for i, (p, c, a) in enumerate(out):
        prompt_ids[i, p_len - len(p) :] = torch.tensor(p)
        prompt_mask[i, p_len - len(p) :] = 1
        completion_ids[i, : len(c)] = torch.tensor(c)
        if a is not None:
            completion_mask[i, : len(c)] = 1
            advantages[i] = a
        else:
            prompt_mask[i] = 0
            prompt_mask[i, -1] = 1  # one attended token keeps the padding row's softmax finite
    batch = {
        "prompt_ids": prompt_ids,
        "prompt_mask": prompt_mask,
        "completion_ids": completion_ids,
        "completion_mask": completion_mask,
        "advantages": advantages,
    }
    batch = {k: v.to(device) for k, v in batch.items()}
    batch["num_items_in_batch"] = completion_mask.sum().to(device)
    return batch


_COMPLETION_SHAPED = (
    "completion_ids",
    "completion_mask",
    "old_per_token_logps",
    "ref_per_token_logps",
    "importance_sampling_ratio",  # (rows, tokens), or (rows, 1) per segment: cutting columns keeps its one
)


def row_passes(batch: dict[str, Any], size: int) -> list[dict[str, Any]]:
    """`batch` cut into passes of `size` rows, each without the columns that are padding in all its rows.

    Scalars (`num_items_in_batch`) are shared. Dropping padding columns changes no loss: prompts are
    left-padded and completions right-padded, and rotary position encodings see only relative positions.
    """
    n = batch["completion_ids"].size(0)
    passes = []
    for start in range(0, n, size):
        piece = {
            k: v[start : start + size] if isinstance(v, torch.Tensor) and v.dim() > 0 else v
            for k, v in batch.items()
        }
        prompt_len = max(1, int(piece["prompt_mask"].sum(1).max()))
        completion_len = max(1, int(piece["completion_mask"].sum(1).max()))
        for key in ("prompt_ids", "prompt_mask"):
            piece[key] = piece[key][:, -prompt_len:]
        for key in _COMPLETION_SHAPED:
            if piece.get(key) is not None:
                piece[key] = piece[key][:, :completion_len]
        passes.append(piece)
    return passes
