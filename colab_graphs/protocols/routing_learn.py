"""The learners behind the trained routers, as plain functions of dev outcomes (no model calls here).

A question is featurised as hashed word unigrams and bigrams (`features`); each dev question's label is the set
of members with the best dev score on it, as a uniform distribution over them (`best_labels`; MoCo breaks ties
with a reward model, which an offline audit does not have). Both learners return a JSON-ready model that the
routers in `colab_graphs.protocols.api_trained` score questions with (`softmax_scores`, `graph_scores`):

- `fit_softmax`: multinomial logistic regression, question features -> best member (`trained_router`);
- `fit_graph_router`: a small GraphRouter-style GNN over the bipartite graph of dev questions and members whose
  edges carry the observed score (`graph_routing`). A member's embedding aggregates the questions it was seen
  on, with their outcome; training hides a random part of the questions' edges and predicts their best member
  from the rest (GraphRouter's edge masking), so a new question, which has no edges, is scored the same way.

Example:
    >>> model = fit_softmax([features("add 2 and 3"), features("write a poem")], [[1.0, 0.0], [0.0, 1.0]])
    >>> [round(s, 2) for s in softmax_scores(model, features("add 4 and 5"))][0] > 0.5
    True
"""

from __future__ import annotations

import math
import re
import zlib
from collections.abc import Sequence
from typing import Any

import numpy as np

DIM = 1 << 16  # hashed feature space (only the features seen on dev get weights)
_WORD = re.compile(r"[a-z0-9]+")

Features = dict[int, float]


def features(text: str) -> Features:
    """Hashed unigrams and bigrams of the lowercased words of `text`, L2-normalised counts."""
    words = _WORD.findall((text or "").lower())
    grams = words + [f"{a} {b}" for a, b in zip(words, words[1:], strict=False)]
    counts: Features = {}
    for g in grams:
        f = zlib.crc32(g.encode()) % DIM
        counts[f] = counts.get(f, 0.0) + 1.0
    norm = math.sqrt(sum(v * v for v in counts.values())) or 1.0
    return {f: v / norm for f, v in counts.items()}


def best_labels(scores: np.ndarray) -> np.ndarray:
    """Per question (row), a uniform distribution over the members (columns) with the best score."""
    best = scores.max(axis=1, keepdims=True)
    hits = np.isclose(scores, best).astype(float)
    return hits / hits.sum(axis=1, keepdims=True)


def _index(rows: Sequence[Features]) -> tuple[list[int], np.ndarray]:
    """(the features used, the rows as a dense matrix over them)."""
    used = sorted({f for row in rows for f in row})
    where = {f: i for i, f in enumerate(used)}
    x = np.zeros((len(rows), len(used)))
    for r, row in enumerate(rows):
        for f, v in row.items():
            x[r, where[f]] = v
    return used, x


def _softmax(z: np.ndarray) -> np.ndarray:
    z = z - z.max(axis=-1, keepdims=True)
    e = np.exp(z)
    return e / e.sum(axis=-1, keepdims=True)


def fit_softmax(
    rows: Sequence[Features],
    labels: Sequence[Sequence[float]],
    *,
    l2: float = 1e-3,
    epochs: int = 300,
    learning_rate: float = 1.0,
) -> dict[str, Any]:
    """Multinomial logistic regression from question features to (soft) best-member labels, by full-batch
    gradient descent from zero weights (deterministic).

    Returns:
        `{"bias": [n], "weights": {feature: [n]}}` over the label columns.
    """
    y = np.asarray(labels, dtype=float)
    used, x = _index(rows)
    w = np.zeros((x.shape[1], y.shape[1]))
    b = np.zeros(y.shape[1])
    for _ in range(epochs):
        p = _softmax(x @ w + b)
        grad = (p - y) / len(y)
        w -= learning_rate * (x.T @ grad + l2 * w)
        b -= learning_rate * grad.sum(axis=0)
    weights = {str(f): [round(float(v), 6) for v in w[i]] for i, f in enumerate(used) if np.any(w[i])}
    return {"bias": [round(float(v), 6) for v in b], "weights": weights}


def _project(table: dict[str, list[float]], bias: list[float], row: Features) -> np.ndarray:
    """bias + sum over the row's features of value * the feature's weights (features not in `table`: none)."""
    z = np.array(bias, dtype=float)
    for f, v in row.items():
        w = table.get(str(f))
        if w is not None:
            z = z + v * np.asarray(w)
    return z


def softmax_scores(model: dict[str, Any], row: Features) -> list[float]:
    """The learned probability of each label column being the best for a question with features `row`."""
    return [float(p) for p in _softmax(_project(model["weights"], model["bias"], row))]


def fit_graph_router(
    rows: Sequence[Features],
    scores: np.ndarray,
    member_rows: Sequence[Features],
    *,
    hidden: int = 8,
    epochs: int = 300,
    learning_rate: float = 0.01,
    weight_decay: float = 1e-4,
    mask_rate: float = 0.5,
    seed: int = 0,
) -> dict[str, Any]:
    """Train the graph router on the dev graph (questions x members, edges weighted by dev score).

    Args:
        rows: each dev question's features.
        scores: dev score of each member (column) on each question (row), in [0, 1].
        member_rows: each member's features (its description; empty when it has none).
        hidden: embedding size.
        epochs: training steps (each hides a new random part of the questions).
        learning_rate: Adam's step size.
        weight_decay: Adam's weight decay.
        mask_rate: fraction of the questions whose edges are hidden and predicted at each step.
        seed: seed of the initial weights and the masks.

    Returns:
        The JSON-ready router: question projection (features seen on dev only), each member's final embedding
        (aggregated over every dev edge) and the edge scorer.
    """
    import torch

    n_q, n_m = scores.shape
    used, xq = _index([*rows, *member_rows])
    xm = torch.tensor(xq[n_q:], dtype=torch.float32)
    xq_t = torch.tensor(xq[:n_q], dtype=torch.float32)
    s = torch.tensor(scores, dtype=torch.float32)
    y = torch.tensor(best_labels(scores), dtype=torch.float32)
    g = torch.Generator().manual_seed(seed)

    def param(*shape: int) -> torch.Tensor:
        return (torch.randn(*shape, generator=g) * 0.1).requires_grad_()

    p = {
        "wq": param(len(used), hidden),
        "bq": param(hidden),
        "wm": param(len(used), hidden),
        "em": param(n_m, hidden),
        "wmsg": param(hidden + 1, hidden),
        "w1": param(3 * hidden, hidden),
        "b1": param(hidden),
        "w2": param(hidden, 1),
        "b2": param(1),
    }

    def members_given(hq: torch.Tensor, visible: torch.Tensor) -> torch.Tensor:
        messages = torch.zeros(n_m, hidden)
        if bool(visible.any()):
            seen = hq[visible]  # (v, h)
            edge = torch.cat([seen.unsqueeze(1).expand(-1, n_m, -1), s[visible].unsqueeze(-1)], dim=-1)
            messages = torch.tanh(edge @ p["wmsg"]).mean(dim=0)  # (m, h): each member's view of the questions
        return torch.tanh(xm @ p["wm"] + p["em"] + messages)

    def edge_scores(hq: torch.Tensor, hm: torch.Tensor) -> torch.Tensor:
        q = hq.unsqueeze(1).expand(-1, n_m, -1)
        m = hm.unsqueeze(0).expand(hq.shape[0], -1, -1)
        pair = torch.cat([q, m, q * m], dim=-1)
        return (torch.tanh(pair @ p["w1"] + p["b1"]) @ p["w2"] + p["b2"]).squeeze(-1)

    optimiser = torch.optim.Adam(list(p.values()), lr=learning_rate, weight_decay=weight_decay)
    hidden_n = max(1, min(n_q, round(mask_rate * n_q)))
    for _ in range(epochs):
        order = torch.randperm(n_q, generator=g)
        target = torch.zeros(n_q, dtype=torch.bool)
        target[order[:hidden_n]] = True
        hq = torch.tanh(xq_t @ p["wq"] + p["bq"])
        hm = members_given(hq, ~target)
        logits = edge_scores(hq[target], hm)
        loss = -(y[target] * torch.log_softmax(logits, dim=-1)).sum(dim=-1).mean()
        optimiser.zero_grad()
        loss.backward()
        optimiser.step()
    with torch.no_grad():
        hq = torch.tanh(xq_t @ p["wq"] + p["bq"])
        hm = members_given(hq, torch.ones(n_q, dtype=torch.bool))

    def listed(t: torch.Tensor) -> Any:
        t = t.detach()
        if t.dim() > 1:
            return [listed(row) for row in t]
        return [round(float(v), 6) for v in t]

    wq = p["wq"].detach()
    seen = {f for row in rows for f in row}  # a member description's own words never come with a question
    return {
        "question": {str(f): listed(wq[i]) for i, f in enumerate(used) if f in seen},
        "question_bias": listed(p["bq"]),
        "members": listed(hm),
        "w1": listed(p["w1"]),
        "b1": listed(p["b1"]),
        "w2": listed(p["w2"].squeeze(-1)),
        "b2": float(p["b2"].detach()[0]),
    }


def graph_scores(model: dict[str, Any], row: Features) -> list[float]:
    """The learned score of the edge between a question with features `row` and each member (higher: better)."""
    hq = np.tanh(_project(model["question"], model["question_bias"], row))
    out = []
    for hm in np.asarray(model["members"], dtype=float):
        pair = np.concatenate([hq, hm, hq * hm])
        h = np.tanh(pair @ np.asarray(model["w1"]) + np.asarray(model["b1"]))
        out.append(float(h @ np.asarray(model["w2"]) + model["b2"]))
    return out
