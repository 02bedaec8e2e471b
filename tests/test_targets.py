"""Context-aware TTFT targets (SPEC §3), pinned to known values."""

from __future__ import annotations

import math

import pytest

from slo.targets import ContextTarget, FixedTarget, TableTarget

TARGET = ContextTarget()


@pytest.mark.parametrize("context,target_s", [
    (0, 0.2), (1, 0.2), (511, 0.2), (512, 0.2), (1024, 0.2),
    (2048, 1.0), (4096, 1.5), (32768, 3.0), (262144, 4.5)])
def test_target_for_a_context_length(context, target_s):
    assert TARGET(context) == pytest.approx(target_s)


def test_just_above_the_breakpoint_uses_the_long_base():
    assert TARGET(1025) == pytest.approx(0.5 * (1 + math.log2(1025 / 1024)))


def test_targets_are_positive_and_monotone():
    values = [TARGET(c) for c in range(0, 300_000, 97)]
    assert all(v > 0 for v in values)
    assert all(b >= a for a, b in zip(values, values[1:]))


@pytest.mark.parametrize("kwargs", [
    {"short_base_s": 0}, {"short_base_s": 0.6, "long_base_s": 0.5}, {"breakpoint_tokens": 0}])
def test_bad_target_settings_are_refused(kwargs):
    with pytest.raises(ValueError):
        ContextTarget(**kwargs)


@pytest.mark.parametrize("target", [
    ContextTarget(), ContextTarget(0.1, 0.3, 2048), FixedTarget(0.25),
    TableTarget(((4096, 0.3), (None, 0.8))), TableTarget(((100, 0.1), (1000, 0.2), (5000, 0.4)))])
def test_sql_and_python_targets_agree(target):
    import duckdb

    lengths = [0, 1, 100, 511, 1024, 1025, 2048, 4096, 4097, 32768, 300000]
    sql = f"SELECT ctx, {target.sql('ctx')} FROM unnest({lengths}) t(ctx) ORDER BY ctx"
    for ctx, value in duckdb.sql(sql).fetchall():
        assert value == pytest.approx(target(ctx), rel=1e-12), ctx
