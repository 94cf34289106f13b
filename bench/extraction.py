"""Answer extraction on long replies built to make it slow: does the time grow linearly with the reply?

Run: ``python bench/extraction.py [--json PATH]``

Each case pads a reply with text made to trigger a backtracking pattern or a per-match rescan (a run of spaces
after "answer:", unclosed `\\boxed{`, a long digit run, unclosed `\\(`, blank lines, repeated answer statements,
repeated option mentions, sentence ends), then ends it with a real answer. Per case: seconds to extract at
250 kB and 1 MB, their ratio (4 for linear time, 16 for quadratic), and the ratio to extracting from the same
length of plain prose, in the same process.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import time

from colab_graphs.tasks.answers import extract_choice, extract_math, extract_number, extract_text

CHOICES = ["Mercury", "Blue whale", "whale"]
CASES = {
    "spaces after 'answer:'": ("answer:" + " " * 50, "\nThe answer is 7.", extract_number),
    "unclosed boxes": ("\\boxed{" * 2, "\nThe answer is 7.", extract_number),
    "digit runs": ("1" * 50 + " ", "\nThe answer is 7.", extract_number),
    "unclosed \\(": ("\\(", "\nThe answer is $x^2$.", extract_math),
    "blank lines": ("\n" * 20, "The answer is (B).", lambda r: extract_choice(r, CHOICES)),
    "repeated statements": ("The answer is (A). ", "Final answer: B", lambda r: extract_choice(r, CHOICES)),
    "repeated option text": ("whale ", "The answer is Blue whale.", lambda r: extract_choice(r, CHOICES)),
    "sentence ends": ("abc. ", "The answer is no.", extract_text),
}
PROSE = "the quick brown fox jumps over the lazy dog "


def seconds(fn, reply: str, repeats: int = 3) -> float:
    """The best of `repeats` extractions, each from a fresh string (parsing caches by text)."""
    best = float("inf")
    for k in range(repeats):
        fresh = f"Attempt {k}: " + reply
        started = time.perf_counter()
        fn(fresh)
        best = min(best, time.perf_counter() - started)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    rows = []
    for name, (pattern, tail, fn) in CASES.items():
        quarter, full = (pattern * (n // len(pattern)) + tail for n in (250_000, 1_000_000))
        plain = PROSE * (1_000_000 // len(PROSE)) + tail
        t_quarter, t_full, t_plain = seconds(fn, quarter), seconds(fn, full), seconds(fn, plain)
        rows.append(
            {
                "case": name,
                "s_250k": round(t_quarter, 4),
                "s_1m": round(t_full, 4),
                "growth": round(t_full / t_quarter, 1),
                "vs_prose": round(t_full / t_plain, 1),
            }
        )
        print(
            f"{name:24s} 250 kB {t_quarter:.3f} s  1 MB {t_full:.3f} s  x{t_full / t_quarter:.1f}  "
            f"vs prose x{t_full / t_plain:.1f}"
        )
    report = {
        "date": datetime.date.today().isoformat(),
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, {platform.python_version()}",
        "rows": rows,
    }
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(report, fh, indent=2)


if __name__ == "__main__":
    main()
