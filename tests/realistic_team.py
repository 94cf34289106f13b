"""A team of scripted members for audit tests: real MoCo records, replies in the styles real models use.

Each member is right on a record with its own accuracy (decided per member and question from sha256, so a
question always gets the same reply); a wrong member gives the record's *trap* answer (the one wrong answer
members agree on) two times in three, else another wrong one; some replies commit to no answer. Styles:
"The answer is (C) <option>", "The correct option is C.", "**C) <option>**", an answer that first names a
wrong option ("It is not (A). The correct option is (B)."), GSM8K's "#### 112", "\\boxed{112}", and a
number written "112.0" (the same answer as "112" to the task, another string to a vote).
"""

from __future__ import annotations

from pathlib import Path

from colab_graphs.tasks.example import Example
from colab_graphs.tasks.loaders import load_examples
from colab_graphs.testing.scripts import last_user_text, unit_draw

MOCO = Path(__file__).parent / "fixtures" / "moco"
LETTERS = "ABCDEFGHIJ"


def records(limit: int = 6) -> list[Example]:
    """ARC-Challenge and GSM8K records from MoCo's own files."""
    return load_examples(MOCO / "arc_challenge.json", limit=limit) + load_examples(
        MOCO / "gsm8k.json", limit=limit
    )


def _choice(example: Example, shift: int) -> tuple[str, str]:
    choices = example.fields["choices"]
    choices = list(choices.values()) if isinstance(choices, dict) else list(choices)
    i = (LETTERS.index(example.answer) + shift) % len(choices)
    return LETTERS[i], choices[i]


def _reply(example: Example, answer_shift: int, style: int) -> str:
    if example.fields.get("choices"):
        letter, option = _choice(example, answer_shift)
        wrong, _ = _choice(example, answer_shift + 1)
        return [
            f"The answer is ({letter}) {option}",
            f"Let's consider each option in turn; only one fits.\n\nThe correct option is {letter}.",
            f"**{letter}) {option}**",
            f"It is not ({wrong}). The correct option is ({letter}).",
        ][style % 4]
    value = int(example.answer) + 7 * answer_shift
    return [
        f"Step by step: the parts add up.\n#### {value}",
        f"So the total is $\\boxed{{{value}}}$.",
        f"The answer is {value}.0",
        f"Adding everything, the answer is {value}.",
    ][style % 4]


def member(examples: list[Example], index: int, accuracy: float, abstains: float = 0.1):
    """Member number `index` of the team: a script for the scripted server."""
    keys = [(e.input.strip()[:60], e) for e in examples]

    def script(messages, params) -> str:
        text = last_user_text(messages)
        example = next((e for key, e in keys if key in text), None)
        if example is None:
            return "I do not know."
        # Samples of a seeded member differ (the call path adds the sample index to the seed).
        draw = ("team", index, example.id, params.get("seed"))
        if unit_draw(*draw, "abstain") < abstains:
            return "I am not sure; this could go several ways."
        if unit_draw(*draw, "right") < accuracy:
            return _reply(example, 0, index)
        shift = 1 if unit_draw(*draw, "trap") < 2 / 3 else 2
        return _reply(example, shift, index)

    return script


def team(examples: list[Example], names: list[str], accuracies: list[float] | None = None) -> dict:
    """Scripted members by name, strongest first."""
    accuracies = accuracies or [0.85 - 0.6 * i / max(1, len(names) - 1) for i in range(len(names))]
    return {
        name: member(examples, i, acc) for i, (name, acc) in enumerate(zip(names, accuracies, strict=True))
    }


# Three members, and the same three under model names LiteLLM's price map prices (the scripted server answers
# under both), for tests of plans and caps.
MEMBERS = ["a", "b", "c"]
PRICED = {"a": "gpt-4o-mini", "b": "gpt-4o", "c": "gpt-3.5-turbo"}


def priced_team(examples: list[Example]) -> dict:
    """Scripted members for `MEMBERS` and their `PRICED` model names (accuracies 0.8, 0.6, 0.4)."""
    return team(examples, [*MEMBERS, *PRICED.values()], [0.8, 0.6, 0.4] * 2)
