"""The engine's memory allocator: tcmalloc, and no oneDNN primitive cache.

On CPU, every distinct batch size (tokens in a step) builds new oneDNN matmul
primitives. With glibc malloc and oneDNN's global primitive cache (1024 entries) the
worker's resident memory grew with each new batch size it saw: +248 MiB over 300
fresh prompt lengths, and 45 MiB/min through a 10-minute soak. vLLM keeps its own
32-entry cache per linear layer, so the global one only costs memory, and tcmalloc
(what vLLM's CPU guide asks for) holds fragmentation down: +60 MiB with both, speed
unchanged within noise (bench/serving/allocator.py; docs/reliability.md, Soak).

tcmalloc must be loaded when the process starts, so `tailguard serve` re-executes
itself once with it in `LD_PRELOAD`; the engine processes inherit it.
`TAILGUARD_TCMALLOC=0` turns this off.

The server process's own heap is frozen once the engine is up and warm (`freeze_heap`),
as vLLM freezes its engine core's: vLLM, torch and the serving objects leave about
800,000 objects the cyclic garbage collector would otherwise scan in every full
collection, 0.39-0.42 s with the GIL held (measured in a running server), a stall of
every stream and of the event loop whenever one comes, however rarely. Frozen, they are
out of its scans; `thaw_heap` gives them back before an engine is shut down (breaker L2's
restart, the server's stop), so what that engine held can be collected.
"""

from __future__ import annotations

import gc
import glob
import os
import sys
from collections.abc import Mapping

from observe import settings
from observe.settings import LD_PRELOAD, ONEDNN_PRIMITIVE_CACHE_CAPACITY, TAILGUARD_TCMALLOC

# What Debian's libtcmalloc-minimal4 installs, then other common places.
TCMALLOC_GLOBS = ("/usr/lib/*-linux-gnu/libtcmalloc_minimal.so.4",
                  "/usr/lib64/libtcmalloc_minimal.so.4", "/usr/lib/libtcmalloc_minimal.so.4")
# Applied with setdefault before the engine starts: an operator's value wins.
ENGINE_ENV_DEFAULTS = {ONEDNN_PRIMITIVE_CACHE_CAPACITY: "0"}


def find_tcmalloc() -> str | None:
    for pattern in TCMALLOC_GLOBS:
        found = sorted(glob.glob(pattern))
        if found:
            return found[0]
    return None


def preload_env(environ: Mapping[str, str], library: str | None) -> dict[str, str] | None:
    """The environment to re-execute with, or None when no re-exec is wanted:
    no library, switched off, or some tcmalloc already preloaded (no loop)."""
    if library is None or not settings.flag(TAILGUARD_TCMALLOC, True, environ):
        return None
    current = settings.get(LD_PRELOAD, "", environ)
    if "libtcmalloc" in current:
        return None
    env = dict(environ)
    env[LD_PRELOAD] = f"{library}:{current}" if current else library
    return env


def reexec_with_tcmalloc(argv: list[str]) -> None:
    """Replace this process by itself with tcmalloc preloaded (same pid, so whoever
    started it keeps its handle). Returns only when nothing is to be done."""
    library = find_tcmalloc()
    env = preload_env(settings.snapshot(), library)
    if env is None:  # vLLM's worker logs a warning when tcmalloc is missing
        return
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(sys.executable, [sys.executable, "-m", "tailguard", *argv], env)


def set_engine_env_defaults() -> None:
    settings.set_defaults(ENGINE_ENV_DEFAULTS)


def freeze_heap() -> int:
    """Collect once, then move every object alive now out of the collector's scans
    (`gc.freeze`); returns how many are frozen."""
    gc.collect()
    gc.freeze()
    return gc.get_freeze_count()


def thaw_heap() -> None:
    """Undo `freeze_heap`: the frozen objects are scanned (and collectable) again."""
    gc.unfreeze()
