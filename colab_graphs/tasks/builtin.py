"""A built-in task that needs no download: generated arithmetic and word problems with exact numeric answers.

It is the default task for tiny local models (SmolLM2-135M) and for tests, so difficulty is mixed on purpose:
two in every five items are single-digit sums a 135M model can get right, the rest climb through two-digit
addition and subtraction, multiplication, and two-step problems. Item `i` depends only on (task, seed, i), so
a longer list extends a shorter one with the same seed.
"""

from __future__ import annotations

import random
from collections.abc import Callable

from colab_graphs.tasks.example import Example

_NAMES = ("Ana", "Ben", "Chen", "Dara", "Eli", "Fatima", "Gus", "Hana", "Ivan", "Jo", "Kofi", "Lena")
_ITEMS = ("apples", "pencils", "stickers", "marbles", "books", "cookies", "shells", "cards")


def builtin_task(name: str = "arithmetic", n: int = 20, seed: int = 0) -> list[Example]:
    """`n` generated examples of the built-in task `name` ("arithmetic" or "word_problems").

    Answers are integers written as strings (the `numeric` scorer applies); each example records its
    `difficulty` ("easy", "medium", "hard").

    Example:
        >>> builtin_task("arithmetic", n=1)[0].input
        'What is 5 + 2?'
    """
    generators = _TASKS.get(name)
    if generators is None:
        raise ValueError(f"unknown built-in task {name!r}; choose from {', '.join(sorted(_TASKS))}")
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    examples = []
    for i in range(n):
        # A string seed is hashed with SHA-512 by `random`: stable across runs and Python versions.
        rng = random.Random(f"{name}:{seed}:{i}")
        difficulty, make = generators[i % len(generators)]
        question, answer = make(rng)
        examples.append(
            Example(id=f"{name}-{seed}-{i}", input=question, answer=str(answer), difficulty=difficulty)
        )
    return examples


def _single_digit_sum(rng: random.Random) -> tuple[str, int]:
    a, b = rng.randint(1, 9), rng.randint(1, 9)
    return f"What is {a} + {b}?", a + b


def _two_digit(rng: random.Random) -> tuple[str, int]:
    a, b = rng.randint(10, 99), rng.randint(10, 99)
    if rng.random() < 0.5:
        return f"What is {a} + {b}?", a + b
    a, b = max(a, b), min(a, b)
    return f"What is {a} - {b}?", a - b


def _product(rng: random.Random) -> tuple[str, int]:
    a, b = rng.randint(2, 12), rng.randint(3, 19)
    return f"What is {a} * {b}?", a * b


def _two_step(rng: random.Random) -> tuple[str, int]:
    a, b, c = rng.randint(2, 20), rng.randint(2, 20), rng.randint(2, 9)
    if rng.random() < 0.5:
        return f"What is ({a} + {b}) * {c}?", (a + b) * c
    return f"What is {a} * {c} - {b}?", a * c - b


def _gain(rng: random.Random) -> tuple[str, int]:
    who, item = rng.choice(_NAMES), rng.choice(_ITEMS)
    a, b = rng.randint(1, 5), rng.randint(2, 4)
    return f"{who} has {a} {item}. {who} gets {b} more {item}. How many {item} does {who} have now?", a + b


def _loss(rng: random.Random) -> tuple[str, int]:
    who, item = rng.choice(_NAMES), rng.choice(_ITEMS)
    a = rng.randint(12, 60)
    b = rng.randint(2, a - 1)
    return f"{who} had {a} {item} and gave away {b}. How many {item} are left?", a - b


def _groups(rng: random.Random) -> tuple[str, int]:
    who, item = rng.choice(_NAMES), rng.choice(_ITEMS)
    boxes, per_box = rng.randint(3, 9), rng.randint(4, 12)
    return f"{who} has {boxes} boxes with {per_box} {item} in each box. How many {item} is that in total?", (
        boxes * per_box
    )


def _change(rng: random.Random) -> tuple[str, int]:
    who, item = rng.choice(_NAMES), rng.choice(_ITEMS)
    price, count = rng.randint(2, 9), rng.randint(2, 6)
    paid = next(bill for bill in (20, 50, 100) if bill > price * count)
    return (
        f"{item.capitalize()} cost {price} dollars each. {who} buys {count} {item} and pays with a {paid} dollar "
        f"bill. How many dollars of change does {who} get?",
        paid - price * count,
    )


Generator = Callable[[random.Random], tuple[str, int]]

_TASKS: dict[str, list[tuple[str, Generator]]] = {
    "arithmetic": [
        ("easy", _single_digit_sum),
        ("easy", _single_digit_sum),
        ("medium", _two_digit),
        ("medium", _product),
        ("hard", _two_step),
    ],
    "word_problems": [
        ("easy", _gain),
        ("easy", _gain),
        ("medium", _loss),
        ("medium", _groups),
        ("hard", _change),
    ],
}
