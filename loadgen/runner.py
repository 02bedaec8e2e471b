"""Async open-loop load generator for any OpenAI-compatible server (ours or vLLM's).

Each arrival is sent at its scheduled time whatever the server is doing; responses are
streamed so TTFT and inter-token times are measured on the client, as users feel them.
Runs are bounded: no request is sent after the workload's duration, and stragglers
are cancelled `drain_s` after the last send.
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from dataclasses import dataclass, field

import httpx

from loadgen.workload import Arrival, Workload, prompt_text


@dataclass(slots=True)
class Result:
    index: int
    sent_s: float  # seconds after the run started
    prompt_words: int
    max_tokens: int
    status: str = "ok"  # ok | error
    error_type: str | None = None
    http_status: int | None = None
    prompt_tokens: int | None = None
    output_tokens: int = 0
    ttft_s: float | None = None
    e2e_s: float | None = None
    token_times: list[float] = field(default_factory=list)  # s after send, per chunk
    retry_after_s: float | None = None  # a refusal's Retry-After header
    retry: Result | None = None  # the one resend after Retry-After (Target.retry_refused)

    @property
    def tpot_s(self) -> float | None:
        """Mean time per output token after the first, from the client's clock."""
        if self.ttft_s is None or self.output_tokens < 2 or len(self.token_times) < 2:
            return None
        return (self.token_times[-1] - self.token_times[0]) / (self.output_tokens - 1)

    def fail(self, error_type: str, http_status: int | None = None) -> None:
        self.status, self.error_type, self.http_status = "error", error_type, http_status


@dataclass(frozen=True, slots=True)
class Target:
    url: str
    model: str
    api_key: str = "unused"
    timeout_s: float = 120.0
    drain_s: float = 60.0
    # A request refused with 429 and Retry-After is sent once more after that long,
    # as a well-behaved client does (`Result.retry`); open loop only.
    retry_refused: bool = False


async def run(target: Target, workload: Workload, on_done=None) -> list[Result]:
    arrivals = workload.arrivals()
    if not arrivals:
        return []
    rng = random.Random(workload.seed + 1)
    prompts = [prompt_text(a.prompt_words, rng) for a in arrivals]  # before the clock starts
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=64)
    async with httpx.AsyncClient(base_url=target.url.rstrip("/"), limits=limits,
                                 timeout=target.timeout_s) as client:
        start = time.monotonic()
        tasks = [asyncio.create_task(_scheduled(client, target, i, a, p, start, on_done))
                 for i, (a, p) in enumerate(zip(arrivals, prompts))]
        done, pending = await asyncio.wait(tasks, timeout=workload.duration_s + target.drain_s)
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
    return [t.result() for t in tasks]


async def run_closed(target: Target, workload: Workload, concurrency: int) -> list[Result]:
    """Closed loop: `concurrency` clients each send the workload's next request as soon
    as their last one ends, until its duration has passed (arrival times are ignored).
    The arrivals are the pool of requests, cycled if it runs out (give the workload a
    rate above what the server completes). A client refused with Retry-After waits
    that long (at most until the end) before its next request, as a well-behaved
    client does, instead of spinning on refusals. The server is never idle, so what
    completes per second is its capacity, and a
    slower server completes fewer: the comparison can fail, unlike an open loop below
    capacity, which measures the arrival clock."""
    arrivals = workload.arrivals()
    if not arrivals or concurrency < 1:
        return []
    rng = random.Random(workload.seed + 1)
    prompts = [prompt_text(a.prompt_words, rng) for a in arrivals]
    results: list[Result] = []
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(base_url=target.url.rstrip("/"), limits=limits,
                                 timeout=target.timeout_s) as client:
        start = time.monotonic()

        async def client_loop(first: int) -> None:
            index = first
            while time.monotonic() - start < workload.duration_s:
                arrival = arrivals[index % len(arrivals)]
                result = Result(index, time.monotonic() - start, arrival.prompt_words,
                                arrival.max_tokens)
                results.append(await _sent(client, target, prompts[index % len(prompts)],
                                           result))
                index += concurrency
                if result.retry_after_s is not None:  # as a well-behaved client does
                    left = workload.duration_s - (time.monotonic() - start)
                    await asyncio.sleep(max(0.0, min(result.retry_after_s, left)))

        await asyncio.gather(*(client_loop(i) for i in range(concurrency)))
    return results


async def _sent(client, target: Target, prompt: str, result: Result) -> Result:
    """Send one request into `result`; a timeout or a lost connection is a failed
    result, a cancellation is marked on it and raised on."""
    try:
        await _stream(client, target, prompt, result.max_tokens, result)
    except asyncio.CancelledError:
        result.fail("cancelled")
        raise
    except httpx.TimeoutException:
        result.fail("timeout")
    except httpx.TransportError:
        result.fail("connection")
    return result


async def _scheduled(client, target, index, arrival: Arrival, prompt, start, on_done) -> Result:
    await asyncio.sleep(max(0.0, start + arrival.at_s - time.monotonic()))
    result = Result(index, time.monotonic() - start, arrival.prompt_words, arrival.max_tokens)
    try:
        await _sent(client, target, prompt, result)
        if target.retry_refused and result.http_status == 429 \
                and result.retry_after_s is not None:
            await asyncio.sleep(result.retry_after_s)
            result.retry = Result(index, time.monotonic() - start, arrival.prompt_words,
                                  arrival.max_tokens)
            await _sent(client, target, prompt, result.retry)
    except asyncio.CancelledError:
        pass  # a straggler cut off at the drain deadline: reported, marked "cancelled"
    if on_done is not None:
        on_done(result)
    return result


async def _stream(client, target: Target, prompt: str, max_tokens: int, result: Result):
    body = {"model": target.model, "prompt": prompt, "max_tokens": max_tokens,
            "temperature": 0, "stream": True, "ignore_eos": True,
            "stream_options": {"include_usage": True}}
    sent = time.monotonic()
    headers = {"Authorization": f"Bearer {target.api_key}"}
    async with client.stream("POST", "/v1/completions", json=body, headers=headers) as resp:
        if resp.status_code != 200:
            result.fail(_error_code(await resp.aread(), resp.status_code), resp.status_code)
            result.retry_after_s = _seconds(resp.headers.get("retry-after"))
            return
        async for line in resp.aiter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                _on_event(json.loads(line[6:]), time.monotonic() - sent, result)
    result.e2e_s = time.monotonic() - sent
    result.http_status = 200


def _on_event(event: dict, elapsed: float, result: Result) -> None:
    if "error" in event:
        result.fail("stream_error")
        return
    # A chunk per generated token; its text may be empty (a partial UTF-8 sequence).
    if any("text" in choice for choice in event.get("choices") or ()):
        if result.ttft_s is None:
            result.ttft_s = elapsed
        result.token_times.append(elapsed)
    usage = event.get("usage")
    if usage:
        result.prompt_tokens = usage.get("prompt_tokens")
        result.output_tokens = usage.get("completion_tokens") or 0


def _seconds(header: str | None) -> float | None:
    try:
        return max(0.0, float(header)) if header is not None else None
    except ValueError:  # an HTTP date: not sent by the servers we drive
        return None


def _error_code(body: bytes, status: int) -> str:
    try:
        return str(json.loads(body)["error"].get("code") or f"http_{status}")
    except (ValueError, KeyError, TypeError, AttributeError):
        return f"http_{status}"


def discover(url: str, api_key: str = "unused") -> tuple[str, int]:
    """(model id, max context) from the server's /v1/models."""
    resp = httpx.get(url.rstrip("/") + "/v1/models", timeout=10,
                     headers={"Authorization": f"Bearer {api_key}"})
    resp.raise_for_status()
    first = resp.json()["data"][0]
    return first["id"], int(first.get("max_model_len") or 4096)
