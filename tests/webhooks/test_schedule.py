"""The retry schedule: its steps, ±20 % jitter, Retry-After up to the next step, the end."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from groupbuy.webhooks.schedule import (
    MAX_DELAY_DIGITS,
    RETRY_WAITS_S,
    parse_retry_after,
    retry_wait_ms,
)


def low(_a: float, _b: float) -> float:
    return 0.8


def high(_a: float, _b: float) -> float:
    return 1.2


def test_the_steps_are_the_specified_ones() -> None:
    assert RETRY_WAITS_S == (5, 300, 1800, 7200, 18000, 36000, 36000)
    centred = [retry_wait_ms(n, uniform=lambda _a, _b: 1.0) for n in range(1, 8)]
    assert centred == [s * 1000 for s in RETRY_WAITS_S]


@pytest.mark.parametrize("tries", range(1, 8))
def test_jitter_stays_within_twenty_percent(tries: int) -> None:
    step = RETRY_WAITS_S[tries - 1] * 1000
    seen = {retry_wait_ms(tries) for _ in range(200)}
    assert all(v is not None and 0.8 * step <= v <= 1.2 * step for v in seen)
    assert len(seen) > 1  # it varies
    assert retry_wait_ms(tries, uniform=low) == round(0.8 * step)
    assert retry_wait_ms(tries, uniform=high) == round(1.2 * step)


def test_after_the_last_step_the_delivery_has_failed() -> None:
    assert retry_wait_ms(8) is None
    assert retry_wait_ms(0) is None


def test_a_longer_retry_after_replaces_the_wait_up_to_the_next_step() -> None:
    assert retry_wait_ms(1, retry_after_s=60, uniform=low) == 60_000
    # longer than the next step (5 min): capped there
    assert retry_wait_ms(1, retry_after_s=10_000, uniform=low) == 300_000
    # shorter than the step's own wait: the step stands
    assert retry_wait_ms(2, retry_after_s=1, uniform=low) == 240_000
    # the last step caps at itself
    assert retry_wait_ms(7, retry_after_s=10**6, uniform=low) == 36_000_000


def test_retry_after_reads_seconds_and_http_dates() -> None:
    now_ms = 1_700_000_000_000
    assert parse_retry_after("120", now_ms) == 120.0
    assert parse_retry_after("Tue, 14 Nov 2023 22:15:20 GMT", now_ms) == 120.0
    assert parse_retry_after("soon", now_ms) is None
    assert parse_retry_after(None, now_ms) is None
    assert parse_retry_after("Tue, 14 Nov 2023 22:00:00 GMT", now_ms) == 0.0


def test_retry_after_reads_the_three_forms_of_an_http_date_as_gmt() -> None:
    now_ms = 1_700_000_000_000
    assert parse_retry_after("Tuesday, 14-Nov-23 22:15:20 GMT", now_ms) == 120.0
    assert parse_retry_after("Tue Nov 14 22:15:20 2023", now_ms) == 120.0


@pytest.mark.parametrize(
    "hostile",
    [
        "\u00b2",  # isdigit() says yes, int() refuses
        "\u0663",  # an Arabic-Indic digit
        "１２０",  # fullwidth digits
        "9" * 400,  # past float's range
        "9" * (MAX_DELAY_DIGITS + 1),
        "-5",
        "+5",
        "1e9",
        "1.5",
        "0x10",
        "12 34",
        "Tue, 14 Nov 99999 22:15:20 GMT",
        "Tue, 14 Nov 2023 22:15:20 GMT\x00",
        "\u00e9t\u00e9",
        "Tue, 14 Nov 2023 22:15:20 GMT, Tue, 14 Nov 2023 22:15:20 GMT",
    ],
)
def test_retry_after_ignores_what_rfc_9110_does_not_allow(hostile: str) -> None:
    assert parse_retry_after(hostile, 1_700_000_000_000) is None


@given(st.text(alphabet=st.characters(codec="latin-1"), max_size=60))
def test_retry_after_never_raises_and_is_finite(value: str) -> None:
    """Whatever a receiver sends (a header is decoded as latin-1)."""
    delay = parse_retry_after(value, 1_700_000_000_000)
    assert delay is None or (math.isfinite(delay) and delay >= 0)
    assert retry_wait_ms(1, delay) is not None
