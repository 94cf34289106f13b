"""`colab-graphs serve` under mixed load: this tree's server against git main's, in the same run.

Run: ``python bench/serve_robust.py [--seconds 30] [--baseline main] [--out bench/results/serve_robust.json]``

Each server runs in its own process (``colab-graphs serve tiny-random``); the baseline is the ``--baseline``
revision's ``colab_graphs`` package, exported with ``git archive`` into a temporary folder and put first on
that process's PYTHONPATH. Against each, for ``--seconds``:

* 16 good clients loop short chat completions (greedy, 16 tokens): their throughput and latency percentiles
  are the figures;
* 4 heavy clients loop long sampled completions (400 tokens), and half of them hang up after 0.5 s (work for
  a client that left);
* 8 streams of 1,000 tokens are opened and never read.

It reports per server: good requests per second, completion tokens per second, p50 / p99 / max latency,
errors, heavy requests answered, and the server's RSS before and after (MiB, from /proc). Then the issue's
case: 20 clients ask for 1,500 tokens and hang up at once, and one good request is timed after them.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import re
import socket
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
import urllib.error
import urllib.request
from io import BytesIO
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
QUESTION = [{"role": "user", "content": "What is 2+2? Answer briefly."}]
GOOD = {"model": "tiny", "messages": QUESTION, "temperature": 0, "max_tokens": 16}
HEAVY = {"model": "tiny", "messages": QUESTION, "temperature": 1, "max_tokens": 400}


def rss_mib(pid: int) -> float:
    status = Path(f"/proc/{pid}/status").read_text()
    return int(re.search(r"VmRSS:\s+(\d+)", status).group(1)) / 1024  # type: ignore[union-attr]


def export(revision: str, into: Path) -> Path:
    """The `colab_graphs` package of `revision`, written under `into`."""
    archive = subprocess.run(
        ["git", "archive", revision, "colab_graphs"], cwd=ROOT, check=True, capture_output=True
    ).stdout
    with tarfile.open(fileobj=BytesIO(archive)) as tar:
        tar.extractall(into, filter="data")
    return into


def start(pythonpath: Path) -> tuple[subprocess.Popen[str], str]:
    command = [sys.executable, "-m", "colab_graphs.cli.app", "serve", "tiny-random", "--port", "0"]
    command += ["--served-name", "tiny", "--no-access-log"]
    env = {**os.environ, "PYTHONPATH": str(pythonpath)}
    # cwd too: `python -m` puts the working folder before PYTHONPATH
    process = subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env, cwd=pythonpath
    )
    assert process.stdout is not None
    line = process.stdout.readline()
    found = re.search(r"at (http://\S+/v1)", line)
    if found is None:
        process.kill()
        raise RuntimeError(f"the server did not start: {line!r}")
    return process, found.group(1)


def post(base_url: str, body: dict[str, Any], timeout: float = 120) -> tuple[int, dict[str, Any]]:
    request = urllib.request.Request(
        f"{base_url}/chat/completions",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as err:
        return err.code, {}
    except OSError:
        return 0, {}


def open_raw(port: int, body: dict[str, Any]) -> socket.socket:
    data = json.dumps(body).encode()
    sock = socket.create_connection(("127.0.0.1", port), timeout=30)
    sock.sendall(
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b"Content-Length: %d\r\n\r\n%s" % (len(data), data)
    )
    return sock


def load(base_url: str, seconds: float) -> dict[str, Any]:
    port = int(base_url.rsplit(":", 1)[1].split("/")[0])
    stop = threading.Event()
    latencies: list[float] = []
    errors = [0]
    tokens = [0]
    heavy_done = [0]
    lock = threading.Lock()

    def good() -> None:
        while not stop.is_set():
            started = time.monotonic()
            status, payload = post(base_url, GOOD)
            took = time.monotonic() - started
            with lock:
                if status == 200:
                    latencies.append(took)
                    tokens[0] += payload["usage"]["completion_tokens"]
                else:
                    errors[0] += 1

    def heavy(leaves: bool) -> None:
        while not stop.is_set():
            if leaves:
                sock = open_raw(port, HEAVY)
                stop.wait(0.5)
                sock.close()
            elif post(base_url, HEAVY)[0] == 200:
                with lock:
                    heavy_done[0] += 1

    never_read = [open_raw(port, {**HEAVY, "max_tokens": 1000, "stream": True}) for _ in range(8)]
    threads = [threading.Thread(target=good) for _ in range(16)]
    threads += [threading.Thread(target=heavy, args=(i % 2 == 0,)) for i in range(4)]
    started = time.monotonic()
    for thread in threads:
        thread.start()
    time.sleep(seconds)
    stop.set()
    elapsed = time.monotonic() - started
    for sock in never_read:
        sock.close()
    for thread in threads:
        thread.join()
    latencies.sort()

    def pct(q: float) -> float:
        return latencies[min(len(latencies) - 1, int(q * len(latencies)))] if latencies else float("nan")

    return {
        "good_requests": len(latencies),
        "good_per_s": len(latencies) / elapsed,
        "tokens_per_s": tokens[0] / elapsed,
        "p50_s": pct(0.5),
        "p99_s": pct(0.99),
        "max_s": latencies[-1] if latencies else float("nan"),
        "errors": errors[0],
        "heavy_answered": heavy_done[0],
    }


def after_abandoned(base_url: str) -> float:
    """The issue's case: 20 clients ask for 1,500 sampled tokens and hang up at once; the seconds the next
    good request then takes."""
    port = int(base_url.rsplit(":", 1)[1].split("/")[0])
    for _ in range(20):
        open_raw(port, {**HEAVY, "max_tokens": 1500}).close()
    time.sleep(0.5)
    started = time.monotonic()
    post(base_url, GOOD)
    return time.monotonic() - started


def measure(name: str, pythonpath: Path, seconds: float) -> dict[str, Any]:
    process, base_url = start(pythonpath)
    try:
        for _ in range(5):
            post(base_url, GOOD)
        rss_before = rss_mib(process.pid)
        result = load(base_url, seconds)
        result["after_abandoned_s"] = after_abandoned(base_url)
        time.sleep(2)
        result.update(server=name, rss_before_mib=rss_before, rss_after_mib=rss_mib(process.pid))
        result["alive"] = process.poll() is None
        return result
    finally:
        process.terminate()
        process.wait(timeout=60)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--baseline", default="main")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "serve_robust.json")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        baseline = export(args.baseline, Path(tmp))
        results = [measure(f"baseline ({args.baseline})", baseline, args.seconds)]
        results.append(measure("this tree", ROOT, args.seconds))
    report = {
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, {platform.platform()}",
        "seconds": args.seconds,
        "results": results,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"{report['date']}  {report['machine']}")
    print("server                good/s  tok/s   p50 s   p99 s   max s  errors  heavy  abandoned  RSS MiB")
    for r in results:
        print(
            f"{r['server']:<20} {r['good_per_s']:7.1f} {r['tokens_per_s']:6.0f} {r['p50_s']:7.3f} {r['p99_s']:7.2f}"
            f" {r['max_s']:7.2f} {r['errors']:7d} {r['heavy_answered']:6d} {r['after_abandoned_s']:9.2f}"
            f"  {r['rss_before_mib']:.0f} -> {r['rss_after_mib']:.0f}"
        )


if __name__ == "__main__":
    main()
