"""Each verdict rule gives the same answer in SQL and in Python, at its boundaries too."""

from __future__ import annotations

import duckdb
import pytest

from cmdare.analytics.verdicts import input_bound_class, input_bound_sql, throttled, throttled_sql

SHARES = [None, 0.0, 0.049999, 0.05, 0.1, 0.199999, 0.2, 0.5, 1.0]


@pytest.mark.parametrize("share", SHARES)
def test_input_bound_class_sql_and_python_agree(share) -> None:
    got = duckdb.sql(f"SELECT {input_bound_sql('s')} FROM (SELECT ?::DOUBLE AS s)", params=[share]).fetchall()[0][0]
    assert got == input_bound_class(share)


def test_input_bound_thresholds_are_the_profilers() -> None:
    assert [input_bound_class(x) for x in (0.0, 0.05, 0.2)] == [
        "not input-bound",
        "moderately input-bound",
        "highly input-bound",
    ]


@pytest.mark.parametrize("mask", [None, 0, 1, 2, 3, 4, 0x40, 0x41])
def test_throttled_sql_and_python_agree_and_idle_is_not_throttling(mask) -> None:
    got = duckdb.sql(f"SELECT {throttled_sql('m')} FROM (SELECT ?::BIGINT AS m)", params=[mask]).fetchall()[0][0]
    assert got == throttled(mask)
    assert throttled(1) is False and throttled(0x41) is True
