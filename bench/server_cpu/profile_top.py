"""Top-N table of a py-spy profile of the server process: where its CPU goes.

Record the running server under load with py-spy's collapsed-stack output (only
samples of threads on a CPU, so idle threads and waits do not count):

    py-spy record --pid PID --duration 30 --rate 200 --format raw --output prof.txt
    python -m bench.server_cpu.profile_top prof.txt --top 25

Each line of the raw format is `frame;frame;...;frame COUNT`, a frame being
`function (file:line)`. The table gives, per function (file and name, lines merged),
its share of all samples on the stack (inclusive) and at the top (self), and how the
samples split between threads when py-spy names them (`--threads`).
"""

from __future__ import annotations

import argparse
import re
from collections import Counter
from pathlib import Path

_FRAME = re.compile(r"^(?P<name>.+?) \((?P<file>[^:()]+)(?::\d+)?\)$")
_SITE = re.compile(r".*/(site-packages|lib/python3\.\d+)/")


def frame_key(frame: str) -> str:
    """`function (package/module.py)`: line numbers merged, paths shortened."""
    match = _FRAME.match(frame.strip())
    if not match:
        return frame.strip()
    path = _SITE.sub("", match["file"])
    path = path.split("/work/main/")[-1]
    return f"{match['name']} ({path})"


def area(key: str) -> str:
    """Where a frame's code lives: our packages, vLLM, the HTTP stack, the rest."""
    path = key.rsplit("(", 1)[-1].rstrip(")")
    top = path.split("/", 1)[0] if "/" in path else path
    if top in ("observe", "serving", "slo", "tailguard"):
        return f"tailguard: {top}/"
    if top in ("uvicorn", "starlette", "fastapi", "httptools", "h11", "anyio", "pydantic",
               "pydantic_core"):
        return "HTTP stack (uvicorn, starlette, fastapi, pydantic)"
    if top in ("vllm", "transformers", "tokenizers", "zmq", "msgspec"):
        return "vLLM front end (serving classes, detokenizer, tokenizer, zmq)"
    if top in ("opentelemetry", "trace", "metrics", "attributes", "sdk", "context",
               "exporter"):  # py-spy names the SDK's files below its namespace package
        return "OpenTelemetry SDK"
    if top in ("duckdb", "pyarrow"):
        return "DuckDB / Arrow"
    if top in ("asyncio", "threading.py", "selectors.py", "concurrent") or path.startswith(
            ("asyncio/", "threading", "selectors", "concurrent/")):
        return "event loop and threads (asyncio, selectors)"
    return "other"


def parse(path: Path) -> tuple[Counter, Counter, int]:
    inclusive: Counter = Counter()
    own: Counter = Counter()
    total = 0
    for line in path.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        n = int(count)
        frames = [frame_key(f) for f in stack.split(";") if f]
        total += n
        for key in set(frames):
            inclusive[key] += n
        if frames:
            own[frames[-1]] += n
    return inclusive, own, total


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("profile", type=Path)
    ap.add_argument("--top", type=int, default=25)
    args = ap.parse_args()
    inclusive, own, total = parse(args.profile)
    areas: Counter = Counter()
    for key, n in own.items():
        areas[area(key)] += n
    print(f"{total} samples\n\n| self % | where the code lives |\n|---:|---|")
    for name, n in areas.most_common():
        print(f"| {100 * n / total:.1f} | {name} |")
    print("\n| self % | function |\n|---:|---|")
    for key, n in own.most_common(args.top):
        print(f"| {100 * n / total:.1f} | `{key}` |")
    print("\n| inclusive % | function |\n|---:|---|")
    for key, n in inclusive.most_common(args.top):
        print(f"| {100 * n / total:.1f} | `{key}` |")


if __name__ == "__main__":
    main()
