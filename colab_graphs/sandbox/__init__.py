"""The sandbox: run code a model wrote, contained, and judge it from a process the code cannot reach.

- `backends`: which containment this machine gives and which one a user's setting selects (`resolve`, in `runner`); where
  none meets the setting, `SandboxUnavailable` names what is missing and the ways out, before any code runs.
- `runner`: `run_code` (one program) and `run_judged` (a candidate process and a judge process apart).
- `launcher`: the inside of a run (a standard-library script: it builds the containment and starts both).
- `harness`: what crosses between the candidate and the judge (plain data over pipes) and what the test sees.
- `code_tests`: `run_tests(code, test)`, the judged run behind the `code` scorer, and its `CodeVerdict`.
"""

from colab_graphs.sandbox.backends import SandboxUnavailable
from colab_graphs.sandbox.runner import availability, resolve

__all__ = ["SandboxUnavailable", "availability", "resolve"]
