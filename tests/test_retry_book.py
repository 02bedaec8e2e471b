"""The retry book: refused requests are told to come back one after another, their
engine time is kept for them, and a booking lapses when nobody comes."""

from __future__ import annotations

import pytest

from observe import registry as R
from slo.policy.retry_book import RetryBook


def test_refusals_in_a_burst_come_back_one_after_another():
    book = RetryBook()
    # the same drain (2.2 s of work ahead), each prompt 0.9 s of engine time
    got = [book.book("a", 500, 100.0, 2.2, 0.9) for _ in range(4)]
    # 3 (ceil 2.2), then after 3 + 0.9 -> 4 (ceil 3.9), 4.9 -> 5, 5.9 -> 6
    assert got == [3, 4, 5, 6]
    assert len(book) == 4


def test_a_long_drain_goes_after_the_bookings_and_a_short_one_waits_for_them():
    book = RetryBook()
    assert book.book("a", 100, 0.0, 10.2, 0.5) == 11
    assert book.book("b", 100, 0.0, 0.1, 0.5) == 12  # booked time ends at 11.5


@pytest.mark.parametrize("client, tokens, at, claimed", [
    ("a", 500, 103.0, True),  # on time
    ("a", 500, 102.0, True),  # a second early: rounding and clocks
    ("a", 500, 101.9, False),  # too early: a new request, not the retry
    ("a", 500, 106.0, True),  # within the 3 s grace
    ("a", 500, 106.1, False),  # lapsed
    ("b", 500, 103.0, False),  # another client
    ("a", 501, 103.0, False),  # another prompt
])
def test_a_booking_is_claimed_by_its_client_and_prompt_in_its_window(client, tokens, at,
                                                                    claimed):
    book = RetryBook()
    assert book.book("a", 500, 100.0, 2.2, 0.9) == 3
    assert book.claim(client, tokens, at) is claimed
    assert len(book) == (0 if claimed or at > 106.0 else 1)


def test_booked_prompts_are_work_ahead_of_newcomers_due_after_their_start():
    book = RetryBook()
    book.book("a", 500, 100.0, 2.2, 0.9)  # back at 103
    book.book("b", 300, 100.0, 2.2, 0.9)  # back at 104
    a, b = 500 * 501 // 2, 300 * 301 // 2  # their attention pairs, fresh prompts
    assert [book.work_due(100.5, due) for due in (101.0, 102.5, 103.5, 120.0)] == \
        [(0, 0), (500, a), (800, a + b), (800, a + b)]
    assert book.claim("a", 500, 103.0)
    assert book.work_due(103.0, 120.0) == (300, b)
    assert book.work_due(107.5, 120.0) == (0, 0)  # b lapsed at 107


def test_a_book_nobody_came_back_to_starts_afresh():
    book = RetryBook()
    assert book.book("a", 100, 0.0, 30.0, 5.0) == 30
    assert book.book("a", 100, 40.0, 1.0, 0.5) == 1  # the first lapsed at 33


def test_retry_after_is_capped():
    assert RetryBook(max_retry_after_s=120).book("a", 1, 0.0, 500.0, 1.0) == 120


def test_the_bookings_coming_before_a_deadline_are_those_due_before_it():
    book = RetryBook()
    book.book("a", 500, 100.0, 2.2, 0.9, R.PRIORITY_REALTIME, 0.2)  # back at 103, due 103.2
    book.book("b", 300, 100.0, 2.2, 0.9, R.PRIORITY_BATCH, 1.5)  # back at 104, due 105.5
    assert [(b.key, b.lane, b.deadline) for b in book.coming(100.0, 104.0)] == [
        (("a", 500), R.PRIORITY_REALTIME, pytest.approx(103.2))]
    assert len(book.coming(100.0, 106.0)) == 2
    assert book.coming(100.0, 103.2) == []  # due at the same moment: not before it
    book.claim("a", 500, 103.0)
    assert [b.key for b in book.coming(103.0, 106.0)] == [("b", 300)]
