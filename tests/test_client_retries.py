"""The clients send a request again after a lost connection, a 503, or a 429 with
Retry-After, a bounded number of times, with jittered waits; `retries=None` never does."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable, Iterator
from datetime import UTC, datetime

import httpx
import orjson
import pytest
from groupbuy_client import (
    GroupBuyAPIError,
    GroupBuyClient,
    GroupBuySyncClient,
    GroupBuyTransportError,
    Retries,
)
from groupbuy_client.retries import retry_after_s

from tests.support.http import SERVICE_KEY

BASE = "http://groupbuy.test"
ACCOUNT = {"user_id": "u1", "balance_cents": 0}
# No waits: the tests count tries, not seconds (waits are checked on `Retries` directly).
QUICK = Retries(attempts=4, base_s=0, max_backoff_s=0)
Answer = Callable[[httpx.Request], httpx.Response]
NO_RETRY_AFTER = 4290  # a scripted step: 429 without a Retry-After header


def _script(*steps: int | str) -> tuple[list[httpx.Request], Answer]:
    """A transport's handler answering `steps` in turn: a status, or "lost" (no answer),
    the last step repeating; and the list of requests it got."""
    seen: list[httpx.Request] = []
    answers: Iterator[int | str] = iter(steps)

    def answer(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        step = next(answers, steps[-1])
        if step == "lost":
            raise httpx.ConnectError("connection refused", request=request)
        assert isinstance(step, int)
        if step == 200:
            return httpx.Response(200, json=ACCOUNT)
        if step == NO_RETRY_AFTER:
            return httpx.Response(429, json={"code": "rate_limited"})
        headers = {"retry-after": "0"} if step in (429, 503) else {}
        return httpx.Response(step, json={"code": f"status_{step}"}, headers=headers)

    return seen, answer


async def _async_account(answer: Answer, retries: Retries | None) -> tuple[str, object]:
    async with GroupBuyClient(
        BASE, SERVICE_KEY, transport=httpx.MockTransport(answer), retries=retries
    ) as gb:
        try:
            return "answered", await gb.account("u1")
        except (GroupBuyAPIError, GroupBuyTransportError) as error:
            return "raised", error


def _sync_account(answer: Answer, retries: Retries | None) -> tuple[str, object]:
    with GroupBuySyncClient(
        BASE, SERVICE_KEY, transport=httpx.MockTransport(answer), retries=retries
    ) as gb:
        try:
            return "answered", gb.account("u1")
        except (GroupBuyAPIError, GroupBuyTransportError) as error:
            return "raised", error


@pytest.fixture(params=["async", "blocking"])
def account(request: pytest.FixtureRequest) -> Callable[..., object]:
    """`account(answer, retries)` through one flavour of the client."""
    if request.param == "blocking":
        return _sync_account

    def run(answer: Answer, retries: Retries | None) -> object:
        return asyncio.run(_async_account(answer, retries))

    return run


@pytest.mark.parametrize(
    ("steps", "tries", "outcome"),
    [
        ((503, 200), 2, "answered"),
        ((429, 200), 2, "answered"),
        (("lost", "lost", 200), 3, "answered"),
        ((503,), 4, "raised"),  # the tries run out: the last answer is raised
        (("lost",), 4, "raised"),
        ((NO_RETRY_AFTER, 200), 1, "raised"),  # a 429 without Retry-After is not waited out
        ((409, 200), 1, "raised"),  # a refusal is an answer
        ((500, 200), 1, "raised"),
    ],
)
def test_what_is_sent_again(
    account: Callable[..., tuple[str, object]],
    steps: tuple[int | str, ...],
    tries: int,
    outcome: str,
) -> None:
    """Each scripted run of answers gives the tries and the outcome listed."""
    seen, answer = _script(*steps)
    got, _ = account(answer, QUICK)
    assert (len(seen), got) == (tries, outcome)


def test_retries_none_sends_once(account: Callable[..., tuple[str, object]]) -> None:
    """With retrying off, a 503 or a lost connection is raised at the first try."""
    for step in (503, "lost"):
        seen, answer = _script(step, 200)
        got, error = account(answer, None)
        assert (len(seen), got) == (1, "raised")
        assert isinstance(error, GroupBuyAPIError if step == 503 else GroupBuyTransportError)


def test_waits_grow_with_jitter_and_stay_bounded() -> None:
    """Full jitter under a doubling ceiling, capped; a longer Retry-After replaces the wait,
    up to its cap, past which the answer is raised."""
    policy = Retries(attempts=6, base_s=0.1, max_backoff_s=0.5, max_retry_after_s=5)
    rng = random.Random(7)
    for attempt, ceiling in [(1, 0.1), (2, 0.2), (3, 0.4), (4, 0.5), (5, 0.5)]:
        waits = [policy.wait_after_no_answer(attempt, rng) for _ in range(200)]
        assert all(w is not None and 0 <= w <= ceiling for w in waits)
        assert len(set(waits)) > 100  # spread out, not one value
    assert policy.wait_after_no_answer(6, rng) is None
    assert policy.wait_after_answer(1, 503, {"retry-after": "3"}, rng) == 3
    assert policy.wait_after_answer(1, 429, {"retry-after": "6"}, rng) is None
    assert policy.wait_after_answer(1, 429, {}, rng) is None
    assert policy.wait_after_answer(1, 404, {"retry-after": "1"}, rng) is None
    with pytest.raises(ValueError):
        Retries(attempts=0)


def test_retry_after_in_seconds_or_as_a_date() -> None:
    """Retry-After reads as delta-seconds or an HTTP date; anything else as absent."""
    now = datetime(2026, 12, 2, 12, 0, 0, tzinfo=UTC)
    assert retry_after_s("7") == 7
    assert retry_after_s("Wed, 02 Dec 2026 12:00:30 GMT", now) == 30
    assert retry_after_s("Wed, 02 Dec 2026 11:00:00 GMT", now) == 0
    assert retry_after_s("soon") is None
    assert retry_after_s(None) is None


async def _dropping_server(drops: int) -> tuple[asyncio.Server, list[int]]:
    """A loopback HTTP server that cuts its first `drops` connections without a word, then
    answers an account; and the count of connections it took."""
    taken = [0]
    body = orjson.dumps(ACCOUNT)
    answer = (
        b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\nconnection: close\r\n"
        b"content-length: %d\r\n\r\n%s" % (len(body), body)
    )

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        taken[0] += 1
        await reader.readuntil(b"\r\n\r\n")
        if taken[0] > drops:
            writer.write(answer)
            await writer.drain()
        writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    return server, taken


async def test_a_connection_cut_without_an_answer_is_sent_again() -> None:
    """Over real sockets, both flavours send again after a connection closed unanswered."""
    server, taken = await _dropping_server(drops=2)
    url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
    async with server:
        async with GroupBuyClient(url, SERVICE_KEY, retries=QUICK) as gb:
            assert await gb.account("u1") == ACCOUNT
        assert taken[0] == 3
        taken[0] = 0

        def blocking() -> object:
            with GroupBuySyncClient(url, SERVICE_KEY, retries=QUICK) as gb:
                return gb.account("u1")

        assert await asyncio.to_thread(blocking) == ACCOUNT
        assert taken[0] == 3
