"""The sequence quota without a server: per-request and per-client bounds, and a
request's share held from `take` until its record is finished (`release`)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from observe.record import RequestRecord
from serving.errors import ApiError
from serving.quota import SequenceQuota, sequences


def _record(request_id: str) -> RequestRecord:
    return RequestRecord(request_id, 0.0, "text_completion")


@pytest.mark.parametrize("request_,count", [
    (SimpleNamespace(n=4), 4),  # chat: one prompt
    (SimpleNamespace(n=2, prompt=["a", "b", "c"]), 6),
    (SimpleNamespace(n=1, prompt=[1, 2, 3]), 1),  # one tokenized prompt
    (SimpleNamespace(n=None, prompt=[[1], [2]]), 2),
])
def test_sequences_are_prompts_times_n(request_, count):
    assert sequences(request_) == count


def test_a_request_over_the_per_request_bound_is_a_400():
    quota = SequenceQuota(max_sequences=8, max_client_sequences=0)
    with pytest.raises(ApiError) as err:
        quota.take(_record("r1"), "key:a", SimpleNamespace(n=9))
    assert (err.value.status, err.value.error_type) == (400, "too_many_sequences")
    assert quota.in_flight("key:a") == 0


def test_a_client_holds_its_sequences_until_each_record_is_released():
    quota = SequenceQuota(max_sequences=8, max_client_sequences=6)
    first, second = _record("r1"), _record("r2")
    quota.take(first, "key:a", SimpleNamespace(n=4))
    with pytest.raises(ApiError) as err:
        quota.take(second, "key:a", SimpleNamespace(n=3))
    assert (err.value.status, err.value.headers) == (429, {"Retry-After": "1"})
    quota.take(second, "key:b", SimpleNamespace(n=3))  # another client is not held back
    assert (quota.in_flight("key:a"), quota.in_flight("key:b")) == (4, 3)
    quota.release(_record("r1"))  # by request id: the finished record names it
    quota.release(first)  # twice, or never taken: nothing more
    quota.release(_record("never-taken"))
    assert (quota.in_flight("key:a"), quota.in_flight("key:b")) == (0, 3)
