"""The searches behind the fitted weight-level methods, as plain async functions of a scoring callable.

Each takes ``score``, an async function from a candidate to its dev score (higher is better), so the
definitions can be read, and tested, apart from models: ``greedy_soup_search`` (Wortsman et al., 2022),
``swarm_search`` (Model Swarms' particle update, Feng et al., 2024) and ``es_search`` (a gradient-free search
for LoraHub's composition weights, Huang et al., 2024).

Example:
    >>> import asyncio
    >>> dev = {("a",): 0.5, ("b",): 0.4, ("a", "b"): 0.6}
    >>> async def score(members):
    ...     return dev[tuple(members)]
    >>> asyncio.run(greedy_soup_search(["a", "b"], score)).soup
    ['a', 'b']
"""

from __future__ import annotations

import math
import random
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np


@dataclass
class SoupSearch:
    """What the greedy soup chose: the soup (pool order), its dev score, each member alone, each addition tried."""

    soup: list[str]
    score: float
    alone: dict[str, float]
    tried: list[dict[str, Any]] = field(default_factory=list)


async def greedy_soup_search(
    members: Sequence[str],
    score: Callable[[list[str]], Awaitable[float]],
    keep_ties: bool = False,
) -> SoupSearch:
    """Greedy soup: rank members by dev score; starting from the best, add each next one when the uniform soup
    with it scores higher on dev than the soup without it (``keep_ties``: at least as high, as MoCo does).

    Args:
        members: candidates in pool order (ties in score keep this order).
        score: dev score of the uniform soup of a list of members (in pool order).
    """
    alone = {m: await score([m]) for m in members}
    ranked = sorted(members, key=lambda m: -alone[m])  # stable: equal scores keep pool order
    soup, best = [ranked[0]], alone[ranked[0]]
    tried = []
    for m in ranked[1:]:
        candidate = [x for x in members if x in soup or x == m]
        value = await score(candidate)
        added = value > best or (keep_ties and value == best)
        tried.append({"member": m, "score": value, "added": added})
        if added:
            soup, best = candidate, value
    return SoupSearch(soup=soup, score=best, alone=alone, tried=tried)


@dataclass
class SwarmSearch:
    """The global best particle (coefficients over the members), its dev score, and the search's length."""

    best: list[float]
    score: float
    iterations: int
    evaluations: int


async def swarm_search(
    n: int,
    score: Callable[[list[float]], Awaitable[float]],
    *,
    population: int = 5,
    max_iterations: int = 5,
    inertia: float = 0.2,
    cognitive: float = 0.3,
    social: float = 0.4,
    repel: float = 0.05,
    step_length: float = 0.5,
    step_length_factor: float = 0.95,
    minimum_step_length: float = 0.1,
    patience: int = 5,
    restart_patience: int = 3,
    seed: int = 0,
) -> SwarmSearch:
    """Model Swarms' particle swarm over ``n`` experts, in the coordinates of the experts' weights.

    A particle is a model θ = Σ_j x_j θ_j. The swarm starts from the experts themselves (x = e_j) plus random
    crossovers of two of them up to ``population``; each starts moving towards a random other particle. Every
    iteration scores each particle, updates personal bests, the global best g and the global worst g_w, then

        v <- (r_w·inertia·v + r_c·cognitive·(p - x) + r_s·social·(g - x) + r_b·repel·(x - g_w)) / (sum of the 4 weights)
        x <- x + step·v,   step <- max(step·step_length_factor, minimum_step_length)

    with r_* ~ U(0, 1). Every term is a difference of particles, so a particle stays an affine combination of
    the experts and the update equals the one on full weights, at the cost of n numbers per particle. The search
    stops after ``max_iterations``, or when the global best has not improved for ``patience`` iterations; a
    particle whose own score has not improved for ``restart_patience`` iterations restarts from its personal best.
    """
    rng = random.Random(seed)
    eye = np.eye(n)
    particles = [eye[j].copy() for j in range(n)]
    while len(particles) < max(population, n):
        i, j = rng.sample(range(n), 2) if n > 1 else (0, 0)
        u = rng.random()
        particles.append(u * eye[i] + (1 - u) * eye[j])
    size = len(particles)

    def towards_random(i: int) -> np.ndarray:
        others = [j for j in range(size) if j != i] or [i]
        return particles[rng.choice(others)] - particles[i]

    velocities = [towards_random(i) for i in range(size)]
    personal = [p.copy() for p in particles]
    personal_score = [-math.inf] * size
    history: list[list[float]] = [[] for _ in range(size)]
    best, best_score = particles[0].copy(), -math.inf
    worst, worst_score = particles[0].copy(), math.inf
    global_history: list[float] = []
    evaluations = iterations = 0
    for iteration in range(max_iterations):
        iterations = iteration + 1
        scores = []
        for p in particles:
            scores.append(await score(p.tolist()))
            evaluations += 1
        for i, s in enumerate(scores):
            history[i].append(s)
            if s > personal_score[i]:
                personal[i], personal_score[i] = particles[i].copy(), s
        top, bottom = int(np.argmax(scores)), int(np.argmin(scores))
        if scores[top] > best_score:
            best, best_score = particles[top].copy(), scores[top]
        if scores[bottom] < worst_score:
            worst, worst_score = particles[bottom].copy(), scores[bottom]
        global_history.append(best_score)
        stalled = len(global_history) > patience and global_history[-1] <= max(global_history[-patience:-1])
        if stalled or iteration == max_iterations - 1:
            break
        for i in range(size):
            own = history[i]
            if len(own) > restart_patience and own[-1] <= max(own[-restart_patience:-1]):
                particles[i] = personal[i].copy()
                velocities[i] = towards_random(i)
                continue
            w = [
                inertia * rng.random(),
                cognitive * rng.random(),
                social * rng.random(),
                repel * rng.random(),
            ]
            total = sum(w) or 1.0
            velocities[i] = (
                w[0] * velocities[i]
                + w[1] * (personal[i] - particles[i])
                + w[2] * (best - particles[i])
                + w[3] * (particles[i] - worst)
            ) / total
            particles[i] = particles[i] + step_length * velocities[i]
        step_length = max(step_length * step_length_factor, minimum_step_length)
    return SwarmSearch(best=best.tolist(), score=best_score, iterations=iterations, evaluations=evaluations)


@dataclass
class WeightSearch:
    """The best weights found, their objective (lower is better), and the evaluations spent."""

    weights: list[float]
    objective: float
    evaluations: int


async def es_search(
    dim: int,
    objective: Callable[[list[float]], Awaitable[float]],
    *,
    budget: int = 20,
    bound: float = 1.5,
    seed: int = 0,
) -> WeightSearch:
    """Minimise ``objective`` over [-bound, bound]^dim with a (1+1) evolution strategy, from all zeros.

    Each step draws x + σ·N(0, I) (clipped to the box), keeps it when it is strictly better, and adapts σ by the
    1/5th success rule (x1.5 on a success, x1.5^(-1/4) on a failure). LoraHub minimises with nevergrad's
    gradient-free optimiser under the same box, start and budget; this one needs no extra dependency.
    """
    if budget < 1:
        raise ValueError(f"budget must be at least 1, got {budget}")
    rng = np.random.default_rng(seed)
    x = np.zeros(dim)
    fx = await objective(x.tolist())
    sigma = bound / 2
    for _ in range(budget - 1):
        y = np.clip(x + sigma * rng.standard_normal(dim), -bound, bound)
        fy = await objective(y.tolist())
        if fy < fx:
            x, fx, sigma = y, fy, sigma * 1.5
        else:
            sigma *= 1.5**-0.25
    return WeightSearch(weights=x.tolist(), objective=fx, evaluations=budget)
