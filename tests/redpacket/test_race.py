"""The flash-grab race on a real redis-server and on a 3-master Redis Cluster, then the
write-behind (SPEC §4.3, 4.5, 4.8)."""

from __future__ import annotations

import asyncio
import random
import time
from collections import defaultdict

import pytest
from sqlalchemy import func, select

from groupbuy import errors
from groupbuy.redpacket.models import AccountRow, GrabRow, LedgerEntryRow
from groupbuy.services import Services
from tests.support.backends import CLUSTER, REAL, WHERE
from tests.support.fixtures import SendPacketViaServices

pytestmark = [pytest.mark.parametrize("backend", [REAL, CLUSTER])]

SHARES = 1_000
USERS = 5_000
REQUESTS = 8_000
CONCURRENCY = 250
AMOUNT = 1_000_000


async def test_flash_grab_race(
    backend: str,
    services: Services,
    capsys: pytest.CaptureFixture[str],
    sent_packet_via_services: SendPacketViaServices,
) -> None:
    packets = services.packets
    await sent_packet_via_services(AMOUNT, SHARES, funds=AMOUNT, packet_id="flash")

    rng = random.Random(2026)
    users = [f"g{i}" for i in range(USERS)]
    # every user once, then 3,000 double taps by users picked at random, all shuffled
    requests = users + [rng.choice(users) for _ in range(REQUESTS - USERS)]
    rng.shuffle(requests)
    answers: dict[str, list[tuple[str, int | None]]] = defaultdict(list)
    gate = asyncio.Semaphore(CONCURRENCY)
    in_flight = peak = 0

    async def grab(user: str) -> None:
        nonlocal in_flight, peak
        async with gate:
            in_flight += 1
            peak = max(peak, in_flight)
            try:
                body = await packets.grabs.grab("flash", user)
                answers[user].append((body["status"], body["amount_cents"]))
            except errors.SoldOut:
                answers[user].append(("sold_out", None))
            finally:
                in_flight -= 1

    began = time.perf_counter()
    await asyncio.gather(*(grab(user) for user in requests))
    grab_seconds = time.perf_counter() - began

    # (answers to one user's concurrent taps may arrive in any order)
    grabbed_answers = [u for u, a in answers.items() for status, _ in a if status == "grabbed"]
    won: dict[str, int] = {}
    for user, replies in answers.items():
        for status, amount in replies:
            if status == "grabbed":
                assert amount is not None, (user, replies)
                won[user] = amount
    assert peak >= 200
    assert sum(len(a) for a in answers.values()) == REQUESTS
    assert len(grabbed_answers) == len(set(grabbed_answers)) == SHARES  # nobody grabbed twice
    assert set(grabbed_answers) == set(won)
    assert sum(won.values()) == AMOUNT and min(won.values()) >= 1
    for user, replies in answers.items():
        if user in won:  # every repeat of a winner says already_grabbed with the same amount
            repeats = [r for r in replies if r[0] != "grabbed"]
            assert repeats == [("already_grabbed", won[user])] * (len(replies) - 1), replies
        else:
            assert all(r == ("sold_out", None) for r in replies), replies

    began = time.perf_counter()
    recorded = await packets.writer.drain_all()
    write_seconds = time.perf_counter() - began
    assert recorded == SHARES + 1  # the grabs and the sold-out record
    async with services.database.sessions() as session:
        rows = {g.user_id: g.amount_cents for g in (await session.scalars(select(GrabRow))).all()}
        credits = (
            await session.execute(
                select(LedgerEntryRow.user_id, LedgerEntryRow.amount_cents).where(
                    LedgerEntryRow.kind == "grab_credit"
                )
            )
        ).all()
        balances = dict(
            (await session.execute(select(AccountRow.user_id, AccountRow.balance_cents))).all()
        )
        entry_count = await session.scalar(select(func.count()).select_from(LedgerEntryRow))
    assert rows == won
    assert sorted(credits) == sorted(won.items())
    assert {u: b for u, b in balances.items() if u != "sender"} == won
    assert balances["sender"] == 0
    assert entry_count == SHARES + 2  # deposit, packet debit, one credit per grab
    assert (await packets.reads.get("flash"))["status"] == "sold_out"
    sql = "PostgreSQL" if not services.database.is_sqlite else "SQLite"
    with capsys.disabled():
        print(
            f"\n[figures] grab race: {REQUESTS} grabs ({REQUESTS - USERS} double taps) by "
            f"{CONCURRENCY} concurrent clients: {REQUESTS / grab_seconds:,.0f} grabs/s on "
            f"{WHERE[backend]}; write-behind: {recorded} records into {sql} in "
            f"{write_seconds:.2f}s = {recorded / write_seconds:,.0f} rows/s (grab row + ledger "
            "credit each)"
        )
