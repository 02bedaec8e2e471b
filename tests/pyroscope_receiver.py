"""A loopback stand-in for a Pyroscope server: decodes what the pyroscope-io agent pushes.

pyroscope-io 1.4 (the Rust agent, `pyroscope-rs/pyspy/1.4.0 reqwest`) speaks one call
only, Connect-style: `POST /push.v1.PusherService/Push`, `Content-Type:
application/proto`, `Content-Encoding: gzip`; the body is a `push.v1.PushRequest`:

    PushRequest      { repeated RawProfileSeries series = 1; }
    RawProfileSeries { repeated types.v1.LabelPair labels = 1; repeated RawSample samples = 2; }
    LabelPair        { string name = 1; string value = 2; }
    RawSample        { bytes raw_profile = 1; string ID = 2; }

and `raw_profile` is a plain (not gzipped again) pprof `Profile`. The agent has no
legacy `/ingest` path (the string is not in its library), so any other path is refused
with 404 and kept in `refused`. Thread tags (`tag_wrapper`, pyroscope-otel's span ids)
arrive as pprof *sample* labels; `configure(tags=...)` as *series* labels.
"""

from __future__ import annotations

import gzip
import threading
import time
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Self

PUSH_PATH = "/push.v1.PusherService/Push"


def fields(buf: bytes):
    """Protobuf wire format: yields (field number, value) with varints as int and
    length-delimited fields as bytes (fixed 32/64-bit fields as raw bytes)."""
    i, n = 0, len(buf)
    while i < n:
        key, i = _varint(buf, i)
        number, wire = key >> 3, key & 7
        if wire == 0:
            value, i = _varint(buf, i)
        elif wire == 2:
            size, i = _varint(buf, i)
            value, i = buf[i:i + size], i + size
        elif wire in (1, 5):
            size = 8 if wire == 1 else 4
            value, i = buf[i:i + size], i + size
        else:
            raise ValueError(f"unsupported wire type {wire}")
        yield number, value


def _varint(buf: bytes, i: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        byte = buf[i]
        i += 1
        value |= (byte & 0x7F) << shift
        shift += 7
        if byte < 0x80:
            return value, i


def _ints(value) -> list[int]:
    """A repeated integer field: packed (bytes) or one unpacked varint."""
    if isinstance(value, int):
        return [value]
    out, i = [], 0
    while i < len(value):
        item, i = _varint(value, i)
        out.append(item)
    return out


@dataclass(frozen=True, slots=True)
class Sample:
    """One pprof sample: its stack as function names (leaf first), labels, values."""

    stack: tuple[str, ...]
    labels: dict[str, str]
    values: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class Push:
    path: str
    headers: dict[str, str]
    labels: dict[str, str]  # the series labels
    sample_types: tuple[str, ...]  # e.g. ("cpu/nanoseconds",)
    samples: tuple[Sample, ...]


def decode_pprof(raw: bytes) -> tuple[tuple[str, ...], list[Sample]]:
    """Sample types and samples of a pprof `Profile` (function names resolved)."""
    strings, functions, locations, raw_samples, types = [], {}, {}, [], []
    for number, value in fields(raw):
        if number == 6:
            strings.append(value.decode())
        elif number == 5:
            f = dict(fields(value))
            functions[f.get(1, 0)] = f.get(2, 0)
        elif number == 4:
            loc = list(fields(value))
            lines = [dict(fields(v)).get(1, 0) for k, v in loc if k == 4]
            locations[dict(loc).get(1, 0)] = lines
        elif number == 2:
            raw_samples.append(list(fields(value)))
        elif number == 1:
            t = dict(fields(value))
            types.append((t.get(1, 0), t.get(2, 0)))
    samples = []
    for parts in raw_samples:
        loc_ids = [i for k, v in parts if k == 1 for i in _ints(v)]
        values = [i for k, v in parts if k == 2 for i in _ints(v)]
        labels = {}
        for k, v in parts:
            if k == 3:
                label = dict(fields(v))
                labels[strings[label.get(1, 0)]] = strings[label.get(2, 0)]
        stack = tuple(strings[functions.get(fid, 0)]
                      for lid in loc_ids for fid in locations.get(lid, []))
        samples.append(Sample(stack, labels, tuple(values)))
    return tuple(f"{strings[t]}/{strings[u]}" for t, u in types), samples


def decode_push(path: str, headers: dict[str, str], body: bytes) -> list[Push]:
    """One `Push` per series of a (gzip) `PushRequest` body."""
    if headers.get("content-encoding", "").lower() == "gzip":
        body = gzip.decompress(body)
    pushes = []
    for number, series in fields(body):
        if number != 1:
            continue
        labels, samples, types = {}, [], ()
        for key, value in fields(series):
            if key == 1:
                pair = dict(fields(value))
                labels[pair.get(1, b"").decode()] = pair.get(2, b"").decode()
            elif key == 2:
                raw = dict(fields(value)).get(1, b"")
                types, decoded = decode_pprof(raw)
                samples.extend(decoded)
        pushes.append(Push(path, headers, labels, types, tuple(samples)))
    return pushes


class PyroscopeReceiver:
    """`with PyroscopeReceiver() as rx:` serves on a free loopback port at `rx.url`."""

    def __init__(self):
        self.pushes: list[Push] = []
        self.refused: list[str] = []
        self._lock = threading.Lock()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.url = f"http://127.0.0.1:{self._server.server_port}"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    def _handler(self):
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                ok = receiver._receive(self.path, self.headers, body)
                self.send_response(200 if ok else 404)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args):
                pass

        return Handler

    def _receive(self, path: str, headers, body: bytes) -> bool:
        with self._lock:
            if path != PUSH_PATH:
                self.refused.append(path)
                return False
            lowered = {k.lower(): v for k, v in headers.items()}
            self.pushes.extend(decode_push(path, lowered, body))
            return True

    def samples(self, **labels: str) -> list[Sample]:
        """Every received sample whose labels include `labels`."""
        with self._lock:
            return [s for p in self.pushes for s in p.samples
                    if all(s.labels.get(k) == v for k, v in labels.items())]

    def wait_for(self, predicate, timeout_s: float = 10.0) -> bool:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if predicate(self):
                return True
            time.sleep(0.05)
        return predicate(self)

    def __enter__(self) -> Self:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._server.shutdown()
        self._server.server_close()
