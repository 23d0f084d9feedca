"""A storm on a packet with terms, on a real redis-server (SPEC §3 "Red packets", §4
guarantees 3, 4 and 14): 2,000 users grab a 500-share packet whose recipients are 1,000 of
them, behind a password. Some recipients give a wrong password first (half of those then
retry with the right one); the outsiders try any password. Exactly recipients who gave
the right password grab, the packet sells out, money is conserved, and the grabs in grab
order are the shares committed at send (checked against `shares_sha256` by hand)."""

from __future__ import annotations

import asyncio
import hashlib
import random
import time
from collections import Counter
from dataclasses import dataclass

import pytest
from sqlalchemy import select

from groupbuy import errors
from groupbuy.redpacket.models import GrabRow
from groupbuy.redpacket.terms import Terms
from groupbuy.services import Services
from tests.support.backends import REAL, WHERE
from tests.support.money import assert_money_conserved

pytestmark = [pytest.mark.parametrize("backend", [REAL])]

SHARES = 500
AMOUNT = 250_000
RECIPIENTS = [f"r{i}" for i in range(1_000)]
OUTSIDERS = [f"o{i}" for i in range(1_000)]
PASSWORD = "红包 2026"
WRONG = "hongbao"
CONCURRENCY = 200
STORM_TIMEOUT_S = 60


@dataclass(frozen=True)
class Answer:
    """One grab as a user made it and the service answered it."""

    user: str
    right: bool  # gave the right password
    outcome: str  # grabbed, or the refusal's code
    amount: int | None = None
    remaining: int | None = None
    attempts_left: int | None = None


def plans(rng: random.Random) -> dict[str, list[bool]]:
    """Each user's grabs in order, True for the right password: 60% of the recipients give
    it at once, 20% give a wrong one then the right one, 20% only a wrong one (so 800
    recipients give it for 500 shares: it sells out); the outsiders give either."""
    made: dict[str, list[bool]] = {}
    for user in RECIPIENTS:
        roll = rng.random()
        made[user] = [True] if roll < 0.6 else [False, True] if roll < 0.8 else [False]
    for user in OUTSIDERS:
        made[user] = [rng.random() < 0.5]
    return made


async def test_only_recipients_with_the_password_grab_the_committed_shares(
    backend: str, services: Services, capsys: pytest.CaptureFixture[str]
) -> None:
    packets = services.packets
    await packets.accounts.deposit("sender", AMOUNT, "funds")
    terms = Terms(recipients=tuple(RECIPIENTS), password=PASSWORD, sender_may_grab=False)
    sent = await packets.sending.send("sender", AMOUNT, SHARES, packet_id="terms", terms=terms)
    commitment = sent.body["shares_sha256"]
    rng = random.Random(38)
    planned = plans(rng)
    order = list(planned)
    rng.shuffle(order)
    answers: list[Answer] = []
    gate = asyncio.Semaphore(CONCURRENCY)

    async def user_grabs(user: str) -> None:
        async with gate:
            for right in planned[user]:
                password = PASSWORD if right else WRONG
                try:
                    body = await packets.grabs.grab("terms", user, password)
                except (errors.NotARecipient, errors.WrongPassword, errors.SoldOut) as refused:
                    left = refused.extra.get("attempts_left")
                    answers.append(Answer(user, right, refused.code, attempts_left=left))
                    continue
                answers.append(
                    Answer(
                        user,
                        right,
                        body["status"],
                        body["amount_cents"],
                        body.get("remaining_count"),
                    )
                )

    began = time.perf_counter()
    await asyncio.wait_for(asyncio.gather(*(user_grabs(u) for u in order)), STORM_TIMEOUT_S)
    grab_seconds = time.perf_counter() - began
    with pytest.raises(errors.SenderCannotGrab):
        await packets.grabs.grab("terms", "sender", PASSWORD)

    # Every answer is one the user's membership and password allow.
    assert len(answers) == sum(len(p) for p in planned.values())
    for a in answers:
        if a.user.startswith("o"):
            assert a.outcome == "not_a_recipient", a
        elif a.right:
            assert a.outcome in ("grabbed", "sold_out"), a
        else:  # one wrong password each: four left (or the packet had sold out first)
            assert (a.outcome, a.attempts_left) in (("wrong_password", 4), ("sold_out", None)), a
    won = {a.user: a.amount for a in answers if a.outcome == "grabbed"}
    assert len(won) == len([a for a in answers if a.outcome == "grabbed"]) == SHARES
    assert set(won) <= set(RECIPIENTS)

    # The grabs in grab order are the committed shares, revealed once sold out.
    body = await packets.reads.get("terms")
    assert body["status"] == "sold_out" and body["remaining_cents"] == 0
    shares, salt = body["shares"], body["salt"]
    assert shares is not None and salt is not None
    packed = b"".join(share.to_bytes(8, "big") for share in shares)
    assert hashlib.sha256(bytes.fromhex(salt) + packed).hexdigest() == commitment
    assert len(shares) == SHARES and sum(shares) == AMOUNT and min(shares) >= 1
    for a in answers:  # the grab answered with k shares left took share SHARES - k
        if a.outcome == "grabbed":
            assert a.remaining is not None and a.amount == shares[SHARES - 1 - a.remaining], a
    paged: list[tuple[str, int]] = []
    cursor: str | None = None
    for _ in range(SHARES // 100 + 1):
        page = await packets.reads.grabs("terms", cursor, 100)
        paged += [(g["user_id"], g["amount_cents"]) for g in page["grabs"]]
        cursor = page["next_cursor"]
        if cursor is None:
            break
    assert [amount for _, amount in paged] == shares
    assert dict(paged) == won

    began = time.perf_counter()
    recorded = await packets.writer.drain_all()
    write_seconds = time.perf_counter() - began
    async with services.database.sessions() as session:
        rows = (
            await session.scalars(
                select(GrabRow).where(GrabRow.packet_id == "terms").order_by(GrabRow.seq)
            )
        ).all()
    assert [(g.user_id, g.amount_cents) for g in rows] == paged
    await assert_money_conserved(services)
    for user in list(won)[:20]:
        assert (await packets.accounts.account(user))["balance_cents"] == won[user]
    assert (await packets.accounts.account("sender"))["balance_cents"] == 0

    outcomes = Counter(a.outcome for a in answers)
    sql = "SQLite" if services.database.is_sqlite else "PostgreSQL"
    told = ", ".join(f"{kind} {n}" for kind, n in sorted(outcomes.items()))
    with capsys.disabled():
        print(
            f"\n[figures] terms storm: {len(answers)} grabs by {len(planned)} users "
            f"({CONCURRENCY} at once) of a {SHARES}-share packet for {len(RECIPIENTS)} "
            f"recipients behind a password: {len(answers) / grab_seconds:,.0f} grabs/s on "
            f"{WHERE[backend]} ({told}); write-behind: {recorded} records in "
            f"{write_seconds:.2f}s into {sql}"
        )
