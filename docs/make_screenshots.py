"""The `colab-graphs view` screenshots of docs/outputs.md, taken in headless Chromium (the system's, as the tests use).

Run: ``python docs/make_screenshots.py ROOT`` where ROOT holds the outputs of the commands README and docs/outputs.md show:
``audits/default-exact`` (colab-graphs audit --method exact --out audits/default-exact), ``studies/mini``
(colab-graphs study --config examples/study_mini.yaml --out studies/mini) and ``runs/tiny`` (colab-graphs train
--config examples/train_tiny.yaml --out runs/tiny). Writes docs/images/view-*.png; fails on a console error.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from playwright.sync_api import sync_playwright

from colab_graphs.viewer import ViewerServer

IMAGES = Path(__file__).resolve().parent / "images"
SHOTS = {  # file -> (page, the element the picture starts at)
    "view-audit.png": ("?path=audits/default-exact", "main"),
    "view-diff.png": ("?path=audits/default-exact&example=arithmetic-0-0&member=quick", "#example"),
    "view-study.png": ("?path=studies/mini", "main"),
    "view-train.png": ("?path=runs/tiny", "main"),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("root", type=Path)
    parser.add_argument("--chromium", default=os.environ.get("COLAB_GRAPHS_CHROMIUM", "/usr/bin/chromium"))
    args = parser.parse_args()
    server = ViewerServer(args.root).start()
    errors: list[str] = []
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=args.chromium, args=["--no-sandbox", "--disable-gpu"])
        page = browser.new_page(viewport={"width": 1280, "height": 860})
        page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
        page.on("pageerror", lambda e: errors.append(str(e)))
        for name, (query, start) in SHOTS.items():
            page.goto(server.url + query)
            page.wait_for_selector("body[data-ready]")
            page.evaluate(f"document.querySelector({start!r}).scrollIntoView()")
            page.screenshot(path=IMAGES / name)
            print(f"{query} -> {IMAGES / name}")
        browser.close()
    server.shutdown()
    if errors:
        raise SystemExit("console errors:\n" + "\n".join(errors))


if __name__ == "__main__":
    main()
