"""Connection deadlines for the HTTP server, at the protocol level (uvicorn's httptools
protocol, subclassed), where a client that never finishes a request can be seen:

- header timeout: from the connection's first byte (or a keep-alive request's first
  byte) to the end of its headers; a connection that sent part of a request gets a 408,
  one that sent nothing is just closed. The deadline is absolute: trickling one byte
  at a time does not extend it.
- body timeout: from the end of the headers to the end of the body, absolute too; the
  request ends with a 408 and the connection is closed. The app sees a disconnect, and
  `body_timed_out(scope)` tells it why.
- keep-alive timeout: an idle connection between requests (uvicorn's own timer, armed
  after each response).
- max connections: a connection over the cap gets a 503 and is closed at once, so idle
  sockets cannot use up the process's file descriptors.
- header size: more than `MAX_HEADERS` header lines or `MAX_HEADER_BYTES` of them get
  a 431 and the connection is closed (httptools sets no bound: a 1 MB header and 20,000
  header lines were served before, each costing the loop Python work per line).

uvicorn alone arms only the keep-alive timer, and only after a first response.
"""

from __future__ import annotations

import resource
from asyncio import TimerHandle
from dataclasses import dataclass

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

DEFAULT_HEADER_TIMEOUT_S = 10.0
DEFAULT_BODY_TIMEOUT_S = 30.0
DEFAULT_KEEP_ALIVE_S = 5.0
MAX_DEFAULT_CONNECTIONS = 4096
FD_HEADROOM = 256  # descriptors kept for the engine, the trace log and logs
MAX_HEADERS = 128  # Apache's default is 100; SDKs and proxies send a few dozen
MAX_HEADER_BYTES = 64 * 1024  # nginx's default large_client_header_buffers is 32 KiB
BODY_TIMEOUT_KEY = "tailguard.body_timeout"  # set in the ASGI scope of a timed-out request


def default_max_connections() -> int:
    """4096, or fewer where the open-file limit would run out first."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return MAX_DEFAULT_CONNECTIONS
    return max(16, min(MAX_DEFAULT_CONNECTIONS, soft - FD_HEADROOM))


@dataclass(frozen=True, slots=True)
class HttpLimits:
    header_timeout_s: float = DEFAULT_HEADER_TIMEOUT_S
    body_timeout_s: float = DEFAULT_BODY_TIMEOUT_S
    keep_alive_s: float = DEFAULT_KEEP_ALIVE_S
    max_connections: int = MAX_DEFAULT_CONNECTIONS

    def __post_init__(self) -> None:
        for name in ("header_timeout_s", "body_timeout_s", "keep_alive_s"):
            if not 0 < getattr(self, name) <= 3600:
                raise ValueError(f"{name} must be in (0, 3600] seconds")
        if self.max_connections < 1:
            raise ValueError("max_connections must be at least 1")


def body_timed_out(scope: dict) -> bool:
    """Whether the server ended this request because its body did not arrive in time."""
    return bool(scope.get(BODY_TIMEOUT_KEY))


def _error(status: int, reason: str, code: str, message: str) -> bytes:
    """A complete `Connection: close` answer in the OpenAI error shape."""
    from serving.errors import ApiError

    body = ApiError(status, code, message).response().body
    head = (f"HTTP/1.1 {status} {reason}\r\ncontent-type: application/json\r\n"
            f"content-length: {len(body)}\r\nconnection: close\r\n\r\n")
    return head.encode("ascii") + body


def protocol_class(limits: HttpLimits) -> type[HttpToolsProtocol]:
    """The protocol class to hand uvicorn (`http=`), bound to these limits."""
    return type("LimitedHttpProtocol", (LimitedHttpProtocol,), {"limits": limits})


class _HeadersTooLarge(Exception):
    """Raised from the parser callback to stop parsing a refused request."""


class LimitedHttpProtocol(HttpToolsProtocol):
    limits = HttpLimits()
    _deadline: TimerHandle | None = None
    _in_request = False  # bytes of a request seen, headers not complete
    _header_lines = 0
    _header_bytes = 0
    _refused = False  # answered 431: nothing more is parsed or answered

    def connection_made(self, transport) -> None:
        super().connection_made(transport)
        if len(self.connections) > self.limits.max_connections:
            self.transport.write(_error(503, "Service Unavailable", "too_many_connections",
                                        "the server has too many open connections"))
            self.transport.close()
            return
        self._arm(self.limits.header_timeout_s, self._headers_expired)

    def connection_lost(self, exc) -> None:
        self._disarm()
        super().connection_lost(exc)

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._in_request = True
        self._header_lines = self._header_bytes = 0
        if self._deadline is None:  # a keep-alive request; the first one's runs from connect
            self._arm(self.limits.header_timeout_s, self._headers_expired)

    def on_header(self, name: bytes, value: bytes) -> None:
        self._header_lines += 1
        self._header_bytes += len(name) + len(value)
        if self._header_lines > MAX_HEADERS or self._header_bytes > MAX_HEADER_BYTES:
            self._refused = True
            self._disarm()
            self.transport.write(_error(
                431, "Request Header Fields Too Large", "headers_too_large",
                f"at most {MAX_HEADERS} header lines of {MAX_HEADER_BYTES} bytes in all"))
            self.transport.close()
            raise _HeadersTooLarge  # httptools stops; uvicorn's 400 is suppressed below
        super().on_header(name, value)

    def data_received(self, data: bytes) -> None:
        if not self._refused:
            super().data_received(data)

    def send_400_response(self, msg: str) -> None:
        if not self._refused:
            super().send_400_response(msg)

    def on_headers_complete(self) -> None:
        self._in_request = False
        self._disarm()
        super().on_headers_complete()
        self._arm(self.limits.body_timeout_s, self._body_expired)

    def on_message_complete(self) -> None:
        self._disarm()
        super().on_message_complete()

    def _arm(self, seconds: float, callback) -> None:
        self._disarm()
        self._deadline = self.loop.call_later(seconds, callback)

    def _disarm(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    def _headers_expired(self) -> None:
        self._deadline = None
        if self.transport.is_closing():
            return
        if self.cycle is not None and not self.cycle.response_complete:
            self.cycle.keep_alive = False  # a pipelined request: close after this answer
            return
        if self._in_request:
            self.transport.write(_error(408, "Request Timeout", "request_timeout",
                                        "request headers did not arrive in time"))
        self.transport.close()

    def _body_expired(self) -> None:
        self._deadline = None
        cycle = self.cycle
        if cycle is None or not cycle.more_body or self.transport.is_closing():
            return
        if self.flow.read_paused:  # uvicorn stopped reading (back-pressure, pipelining)
            self._arm(self.limits.body_timeout_s, self._body_expired)
            return
        cycle.scope[BODY_TIMEOUT_KEY] = True  # type: ignore[literal-required]
        if not cycle.response_started:
            self.transport.write(_error(408, "Request Timeout", "request_timeout",
                                        "the request body did not arrive in time"))
        cycle.disconnected = True
        cycle.message_event.set()
        self.transport.close()
