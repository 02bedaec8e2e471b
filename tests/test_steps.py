"""The step probe's datagrams credit sampler time to the right requests."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from observe.settings import TAILGUARD_STEP_SOCKET as ENV_STEP_SOCKET
from observe.stats import StepRecord
from serving.engine.stats import EngineSecond
from serving.engine.step_plugin import StepSender, prefill_progress
from serving.engine.step_receiver import NoStepLedger, StepLedger, external_id


@pytest.fixture
def ledger():
    seen: list[StepRecord] = []
    led = StepLedger([seen.append])
    led.seen = seen
    yield led
    led.close()


def _step(sender: StepSender, start: float, forward: float, sampling: float, ids: dict) -> None:
    out = SimpleNamespace(num_scheduled_tokens=ids, total_num_scheduled_tokens=sum(ids.values()))
    sender.forward_done(start, start + forward, out)
    sender.sampling_done(start + forward, start + forward + sampling)


def test_internal_ids_map_back_to_engine_ids():
    assert external_id("cmpl-abc-0-1a2b3c4d") == "cmpl-abc-0"


def test_steps_are_credited_to_tracked_requests(ledger):
    tally = ledger.track("cmpl-abc-0", owner="abc")
    sender = StepSender(ledger.path)
    _step(sender, 1.0, 0.010, 0.002, {"cmpl-abc-0-1a2b3c4d": 7, "other-9f9f9f9f": 1})
    _step(sender, 1.1, 0.005, 0.001, {"cmpl-abc-0-1a2b3c4d": 1})
    assert ledger.drain() == 2
    assert (tally.steps, tally.sampling_s) == (2, pytest.approx(0.003))
    ledger.untrack("cmpl-abc-0")
    ledger._publish()
    assert [s.request_ids for s in ledger.seen] == [("abc", "other"), ("abc",)]
    assert ledger.seen[0].scheduled_tokens == 8 and ledger.seen[0].index == 1


def test_a_step_without_sampling_still_counts(ledger):
    sender = StepSender(ledger.path)
    out = SimpleNamespace(num_scheduled_tokens={"x-00000000": 3}, total_num_scheduled_tokens=3)
    sender.forward_done(2.0, 2.5, out)
    sender.send(0.0)
    ledger.drain()
    ledger._publish()
    assert ledger.seen[0].sampling_s == 0.0 and ledger.seen[0].forward_s == 0.5


def _wait(condition, limit_s: float = 2.0) -> bool:
    import time

    began = time.monotonic()
    while not condition() and time.monotonic() - began < limit_s:
        time.sleep(0.002)
    return condition()


def test_a_step_drained_by_the_loop_wakes_the_sleeping_thread_to_publish_it():
    """The thread sleeps on its socket (poll 5 s here) while no step comes; a step the
    event loop drained first (at a request's end, or before an output batch) wakes it
    once, so the consumers get it within milliseconds, not at the poll."""
    import time

    seen: list[StepRecord] = []
    led = StepLedger([seen.append], poll_s=5.0, hold_s=0.01).start()
    try:
        sender = StepSender(led.path)
        _step(sender, 1.0, 0.010, 0.002, {"a-00000000": 1})
        assert _wait(lambda: len(seen) == 1)
        assert _wait(lambda: not led._active)  # a quiet hold: back on the socket
        with led._lock:  # the loop's drain takes the datagram before the thread
            _step(sender, 2.0, 0.010, 0.002, {"b-00000000": 1})
            time.sleep(0.01)
        led.drain()
        began = time.monotonic()
        assert _wait(lambda: len(seen) == 2)
        assert time.monotonic() - began < 1.0  # woken, not the 5 s poll
        assert [s.request_ids for s in seen] == [("a",), ("b",)]
    finally:
        led.close()


def test_while_steps_come_the_thread_wakes_on_its_timer_not_per_datagram():
    """Five steps sent during a hold are drained and published by one wake-up; once a
    hold passes with no step the thread sleeps on the socket again, with no timer."""
    import time

    seen: list[StepRecord] = []
    led = StepLedger([seen.append], poll_s=5.0, hold_s=0.5).start()
    try:
        sender = StepSender(led.path)
        _step(sender, 1.0, 0.010, 0.002, {"a-00000000": 1})
        assert _wait(lambda: len(seen) == 1) and led.wakeups == 1
        for i in range(5):  # within the 0.5 s hold that follows: they wait in the socket
            _step(sender, 2.0 + i, 0.010, 0.002, {"b-00000000": 1})
        assert _wait(lambda: len(seen) == 6)
        assert led.wakeups == 2
        assert _wait(lambda: not led._active) and led.wakeups == 3
        time.sleep(0.3)
        assert led.wakeups == 3 and sender.dropped == 0
    finally:
        led.close()


def test_the_loop_drains_before_each_output_batch_is_processed(ledger):
    """`drain_before` wraps vLLM's `OutputProcessor.process_outputs`: a step's datagram
    (sent before its outputs) is applied, its prompt hooks run, before the batch is."""
    prefilled: list[str] = []
    tally = ledger.track("cmpl-a-0", owner="a", on_prefilled=lambda: prefilled.append("a"))
    calls = []

    class Processor:
        def process_outputs(self, outputs, timestamp=None):
            calls.append((outputs, tally.steps, list(prefilled)))
            return "processed"

    processor = Processor()
    ledger.drain_before(processor)
    sender = StepSender(ledger.path)
    sender._progress = (["cmpl-a-0-1a2b3c4d"], [], 0)
    out = SimpleNamespace(num_scheduled_tokens={"cmpl-a-0-1a2b3c4d": 5},
                          total_num_scheduled_tokens=5)
    sender.forward_done(1.0, 1.01, out)
    sender.sampling_done(1.01, 1.012)
    assert processor.process_outputs(["out"], timestamp=1.02) == "processed"
    assert calls == [(["out"], 1, ["a"])]
    ledger.drain_before(None)  # an engine without an output processor: nothing to wrap
    NoStepLedger().drain_before(processor)


def test_what_admission_reads_is_updated_as_a_step_is_drained_the_rest_later():
    """`at_once` consumers (the step-time average, the live engine model) run in the
    drain itself, on the event loop before the step's outputs; the others (the
    `llm.step` row, the engine second) wait for the ledger's thread."""
    at_once: list[StepRecord] = []
    later: list[StepRecord] = []
    led = StepLedger([later.append], at_once=[at_once.append, _broken])
    try:
        sender = StepSender(led.path)
        _step(sender, 1.0, 0.010, 0.002, {"a-00000000": 1})
        assert led.drain() == 1
        assert [s.index for s in at_once] == [1] and later == []
        led._publish()
        assert [s.index for s in later] == [1] and len(at_once) == 1
    finally:
        led.close()


@pytest.mark.parametrize("steps_s,hold_s", [
    ([], 0.015),  # no step yet: the shortest hold
    ([0.001], 0.015),  # fast steps: never under hold_s
    ([0.040], 0.120),  # three step times
    ([0.040, 0.090], pytest.approx(3 * (0.040 + 0.2 * 0.050))),  # a running average
    ([0.400], 0.25),  # slow steps: at most max_hold_s
])
def test_the_threads_hold_follows_the_engines_step_time(steps_s, hold_s, ledger):
    """Each wake-up of the thread takes the GIL from a busy loop, so it sleeps three
    step times (a running average, weight 0.2 to the newest) between 15 ms and 250 ms:
    fewer wake-ups when steps are slow, and ten steps can still never pile up in the
    socket between two of them. An idle gap between steps does not stretch it."""
    sender = StepSender(ledger.path)
    for i, step_s in enumerate(steps_s):
        _step(sender, 10.0 * i, step_s, 0.0, {"a-00000000": 1})
    ledger.drain()
    assert ledger.hold() == hold_s
    assert ledger.describe()["hold_s"] == pytest.approx(hold_s, abs=1e-4)


def test_publish_hands_every_step_received_to_the_consumers_at_once(ledger):
    """`/admin/flush` reads right after a request: the steps its thread has not
    published yet (up to a hold late) go to the consumers first, in order."""
    sender = StepSender(ledger.path)
    for i in range(3):
        _step(sender, float(i), 0.010, 0.002, {"a-00000000": 1})
    assert ledger.publish() == 3
    assert [s.index for s in ledger.seen] == [1, 2, 3]
    assert ledger.publish() == 0


def _broken(step: StepRecord) -> None:
    raise RuntimeError("a broken consumer must not stop step accounting")


def test_steps_dropped_at_a_full_socket_are_counted_by_the_server(ledger):
    """Hostile: nobody drains (a stalled loop and thread). The socket queues a few
    datagrams, the probe drops the rest without waiting; the server, which never sees
    the engine's own count, finds them as gaps in the step index once a later step
    comes. A new engine process numbering from 1 again is no gap."""
    sender = StepSender(ledger.path)
    for i in range(300):
        _step(sender, float(i), 0.001, 0.0, {"a-00000000": 1})
    assert sender.dropped > 0  # Linux queues 10 (net.unix.max_dgram_qlen)
    received = ledger.drain()
    _step(sender, 300.0, 0.001, 0.0, {"a-00000000": 1})
    assert ledger.drain() == 1
    assert received + sender.dropped == 300
    assert ledger.steps_lost == sender.dropped
    restarted = StepSender(ledger.path)
    _step(restarted, 400.0, 0.001, 0.0, {"a-00000000": 1})
    ledger.drain()
    assert ledger.steps_lost == sender.dropped
    assert ledger.describe()["steps_seen"] == received + 2


def test_sending_to_no_server_drops_and_counts(tmp_path):
    sender = StepSender(str(tmp_path / "nobody.sock"))
    _step(sender, 0.0, 0.1, 0.1, {"a-00000000": 1})
    assert sender.dropped == 1


def test_start_exports_the_socket_and_close_removes_it():
    led = StepLedger().start()
    import os

    assert os.environ[ENV_STEP_SOCKET] == led.path
    led.close()
    assert ENV_STEP_SOCKET not in os.environ and not os.path.exists(led.path)


def test_engine_second_takes_and_resets():
    second = EngineSecond()
    second.on_scheduler(running=4, waiting=2, kv_cache_usage=0.5)
    second.on_iteration(prompt_tokens=100, generation_tokens=4, preemptions=1, finished=2)
    second.on_step(StepRecord(1, 0.0, 0.008, 0.002, 10, ("a", "b", "c", "d")))
    second.on_step(StepRecord(2, 0.1, 0.004, 0.002, 2, ("a", "b")))
    snap = second.take(now=5.0)
    assert (snap.running, snap.waiting, snap.kv_cache_usage) == (4, 2, 0.5)
    assert (snap.prompt_tokens, snap.generation_tokens, snap.preemptions, snap.finished) == \
        (100, 4, 1, 2)
    assert (snap.steps, snap.mean_batch_size, snap.max_batch_size) == (2, 3.0, 4)
    assert snap.mean_step_s == pytest.approx(0.008) and snap.mean_sampling_s == 0.002
    empty = second.take(now=6.0)
    assert (empty.steps, empty.generation_tokens, empty.running) == (0, 0, 4)
    assert empty.mean_step_s is None


def _new(req_id: str, prompt: int, computed: int = 0) -> SimpleNamespace:
    return SimpleNamespace(req_id=req_id, prompt_token_ids=[0] * prompt,
                           num_computed_tokens=computed)


# attention pairs: a chunk of n tokens after c computed attends c * n + n * (n + 1) / 2
@pytest.mark.parametrize("new, cached, states, scheduled, ends, chunks, pairs", [
    # a whole prompt in one step: its first token comes out of it
    ([_new("a", 300)], [], {}, {"a": 300}, ["a"], [], 300 * 301 // 2),
    # a prefix-cache hit of 256: the rest finishes it
    ([_new("a", 300, computed=256)], [], {}, {"a": 44}, ["a"], [], 256 * 44 + 44 * 45 // 2),
    # chunked: the first 2,048 of a 4,000-token prompt do not, but are done
    ([_new("a", 4000)], [], {}, {"a": 2048}, [], [["a", 2048]], 2048 * 2049 // 2),
    # ... a prefix-cache hit counts as done with the first chunk
    ([_new("a", 4000, computed=512)], [], {}, {"a": 1024}, [], [["a", 1536]],
     512 * 1024 + 1024 * 1025 // 2),
    # ... a middle chunk, then the last chunk; a request already decoding: nothing but
    # its one token over its 301 of context
    ([], [("a", 1024), ("b", 301)], {"a": 4000, "b": 300}, {"a": 1024, "b": 1}, [],
     [["a", 1024]], 1024 * 1024 + 1024 * 1025 // 2 + 302),
    ([], [("a", 2048), ("b", 301)], {"a": 4000, "b": 300}, {"a": 1952, "b": 1}, ["a"], [],
     2048 * 1952 + 1952 * 1953 // 2 + 302),
    # a request the runner no longer holds is skipped, not a crash (its token counted)
    ([], [("gone", 10)], {}, {"gone": 1}, [], [], 11),
])
def test_the_probe_names_the_prompts_a_step_finishes_and_advances(new, cached, states,
                                                                 scheduled, ends, chunks,
                                                                 pairs):
    output = SimpleNamespace(
        num_scheduled_tokens=scheduled, scheduled_new_reqs=new,
        scheduled_cached_reqs=SimpleNamespace(req_ids=[c[0] for c in cached],
                                              num_computed_tokens=[c[1] for c in cached]))
    runner = SimpleNamespace(requests={k: SimpleNamespace(num_prompt_tokens=v)
                                       for k, v in states.items()})
    assert prefill_progress(runner, output) == (ends, chunks, pairs)


def test_prompt_chunks_and_ends_reach_their_requests_hooks(ledger):
    calls = []
    ledger.track("cmpl-doc-0", owner="doc", on_prefilled=lambda: calls.append("end"),
                 on_chunk=lambda tokens: calls.append(tokens))
    sender = StepSender(ledger.path)
    first = SimpleNamespace(num_scheduled_tokens={"cmpl-doc-0-1a2b3c4d": 2048},
                            total_num_scheduled_tokens=2048,
                            scheduled_new_reqs=[_new("cmpl-doc-0-1a2b3c4d", 3000)],
                            scheduled_cached_reqs=SimpleNamespace(req_ids=[],
                                                                  num_computed_tokens=[]))
    last = SimpleNamespace(num_scheduled_tokens={"cmpl-doc-0-1a2b3c4d": 952},
                           total_num_scheduled_tokens=952, scheduled_new_reqs=[],
                           scheduled_cached_reqs=SimpleNamespace(
                               req_ids=["cmpl-doc-0-1a2b3c4d"], num_computed_tokens=[2048]))
    runner = SimpleNamespace(requests={"cmpl-doc-0-1a2b3c4d":
                                       SimpleNamespace(num_prompt_tokens=3000)})
    for step, at in ((first, 1.0), (last, 1.3)):
        sender.forward_starts(runner, step)
        sender.forward_done(at, at + 0.25, step)
        sender.sampling_done(at + 0.25, at + 0.26)
    assert ledger.drain() == 2
    assert calls == [2048, "end"]
    # the steps' attention pairs reach the records the consumers get: the last chunk
    # attends to the first's 2,048 tokens too
    ledger._publish()
    assert [s.attention_pairs for s in ledger.seen] == [2048 * 2049 // 2,
                                                       2048 * 952 + 952 * 953 // 2]


def test_a_finished_prompt_calls_its_requests_hook_once(ledger):
    calls = []
    ledger.track("cmpl-abc-0", owner="abc", on_prefilled=lambda: calls.append("abc"))
    sender = StepSender(ledger.path)
    new = SimpleNamespace(num_scheduled_tokens={"cmpl-abc-0-1a2b3c4d": 7},
                          total_num_scheduled_tokens=7, scheduled_new_reqs=[_new("cmpl-abc-0-1a2b3c4d", 7)],
                          scheduled_cached_reqs=SimpleNamespace(req_ids=[],
                                                                num_computed_tokens=[]))
    sender.forward_starts(SimpleNamespace(requests={}), new)
    sender.forward_done(1.0, 1.01, new)
    sender.sampling_done(1.01, 1.02)
    _step(sender, 1.1, 0.005, 0.001, {"cmpl-abc-0-1a2b3c4d": 1})  # decoding: no call
    assert ledger.drain() == 2
    assert calls == ["abc"]


def test_a_probe_that_cannot_read_the_step_still_sends_it(ledger):
    """vLLM's internals moved: the step still counts, the server falls back on outputs."""
    sender = StepSender(ledger.path)
    broken = SimpleNamespace(num_scheduled_tokens={"x-00000000": 3},
                             total_num_scheduled_tokens=3)
    sender.forward_starts(SimpleNamespace(), broken)
    sender.forward_done(2.0, 2.5, broken)
    sender.send(0.0)
    assert ledger.drain() == 1
