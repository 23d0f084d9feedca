"""Property-based test of red packets as people send them (SPEC §3 "Red packets", §4
guarantees 3, 4 and 14).

A hypothesis state machine drives the packet engine on fakeredis and SQLite, with Redis's
clock frozen (tests/support/engine_stack.py), through sends (either strategy, with or
without recipients or a password, the sender allowed to grab or not), grabs by
recipients, outsiders and the sender with right, wrong or missing passwords, withdrawals
by the sender and by someone else, time passing (with or without the expiry sweep), and
Redis losing everything (FLUSHALL) followed by grabs.

A model predicts every answer: each grab's amount is the next committed share, each
refusal its code (and `attempts_left`). After every step the write-behind is drained and
each packet is read back from Redis and from SQL: its grabs are the model's, in grab
order, and the first shares of its commitment; its money adds up; every balance is the
model's, and money is conserved.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Awaitable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from hypothesis import Phase, event
from hypothesis import settings as hypothesis_settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)
from sqlalchemy import select

from groupbuy import errors
from groupbuy.redpacket.commitment import Commitment, holds
from groupbuy.redpacket.models import GrabRow, PacketContentsRow, PacketRow
from groupbuy.redpacket.terms import Terms
from groupbuy.services import Services
from tests.support.engine_stack import EngineStack
from tests.support.money import assert_money_conserved

T = TypeVar("T")
# No shrinking: each step reads every packet from Redis and SQL, so shrinking a failure
# takes minutes; the failing steps (at most stateful_step_count) are printed as found.
PHASES = [Phase.explicit, Phase.reuse, Phase.generate]

SENDERS = ["s0", "s1"]
USERS = ["u0", "u1", "u2", "u3", "u4"]
PEOPLE = SENDERS + USERS
PERSON = st.sampled_from(PEOPLE)
PACKETS_AT_MOST = 3
SENDS = st.fixed_dictionaries(
    {
        "sender": st.sampled_from(SENDERS),
        "count": st.integers(1, 4),
        "cents_each": st.integers(1, 40),
        "strategy": st.sampled_from(["double_mean", "equal"]),
        "recipients": st.none() | st.lists(PERSON, min_size=1, max_size=6, unique=True),
        "password": st.none() | st.just("sesame"),
        "sender_may_grab": st.booleans(),
        "expires_in_s": st.sampled_from([10, 30, 60]),
        "funded": st.sampled_from([True, True, True, False]),
    }
)
GIVEN = st.sampled_from(["right", "wrong", "none"])
WRONG_PASSWORDS_ALLOWED = 5  # lua/_packet_lib.lua, max_wrong_passwords
ENDED = ("sold_out", "expired", "withdrawn")


@dataclass
class Model:
    """What one packet should be: its terms, its committed shares, who got what."""

    packet_id: str
    sender: str
    amount: int
    count: int
    recipients: frozenset[str] | None
    password: str | None
    sender_may_grab: bool
    expires_at_s: int  # on the model's clock (seconds since the machine started)
    shares: tuple[int, ...]  # the commitment SQL keeps
    sha256: str  # what the send answered
    status: str = "active"
    refunded: int = 0
    grabs: list[tuple[str, int]] = field(default_factory=list)
    wrong: Counter[str] = field(default_factory=Counter)

    def grabbed(self) -> dict[str, int]:
        return dict(self.grabs)

    def left(self) -> int:
        return self.amount - sum(amount for _, amount in self.grabs)


class PacketMachine(RuleBasedStateMachine):
    """Random sends, grabs, withdrawals and time; the guarantees checked after each one."""

    def __init__(self) -> None:
        super().__init__()
        self.stack = EngineStack()
        self.now_s = 0
        self.packets: list[Model] = []
        self.balances: Counter[str] = Counter()
        self.deposits = 0

    def teardown(self) -> None:
        self.stack.close()

    @property
    def services(self) -> Services:
        return self.stack.services

    def run(self, step: Awaitable[T]) -> T:
        return self.stack.run(step)

    def answer(self, step: Awaitable[Any]) -> tuple[str, Any]:
        """Run one call: ("ok", its answer), or (the refusal's code, the refusal)."""
        try:
            return "ok", self.run(step)
        except errors.GroupBuyError as refused:
            return refused.code, refused

    def packet(self, index: int) -> Model:
        return self.packets[index % len(self.packets)]

    # -- steps ---------------------------------------------------------------------------

    @initialize(send=SENDS)
    def first_send(self, send: dict[str, Any]) -> None:
        self.send(**{**send, "funded": True})

    @precondition(lambda self: len(self.packets) < PACKETS_AT_MOST)
    @rule(send=SENDS)
    def another_send(self, send: dict[str, Any]) -> None:
        self.send(**send)

    def send(
        self,
        sender: str,
        count: int,
        cents_each: int,
        strategy: str,
        recipients: list[str] | None,
        password: str | None,
        sender_may_grab: bool,
        expires_in_s: int,
        funded: bool,
    ) -> None:
        amount = count * cents_each
        if funded:
            self.run(self.services.packets.accounts.deposit(sender, amount, f"d{self.deposits}"))
            self.deposits += 1
            self.balances[sender] += amount
        packet_id = f"p{len(self.packets)}"
        terms = Terms(
            recipients=tuple(recipients or ()), password=password, sender_may_grab=sender_may_grab
        )
        sending = self.services.packets.sending
        code, sent = self.answer(
            sending.send(sender, amount, count, packet_id, expires_in_s, strategy, terms)
        )
        event(f"send: {code}")
        if recipients is not None and len(recipients) < count:
            assert code == "invalid_request", (code, sent)
            return
        if self.balances[sender] < amount:
            assert code == "insufficient_funds", (code, sent)
            return
        assert code == "ok", (code, sent)
        commitment = self.run(self.commitment(packet_id))
        assert len(commitment.shares) == count and sum(commitment.shares) == amount
        assert min(commitment.shares) >= 1
        if strategy == "equal":
            assert max(commitment.shares) - min(commitment.shares) <= 1, commitment
        assert sent.body["shares_sha256"] == commitment.sha256
        self.balances[sender] -= amount
        self.packets.append(
            Model(
                packet_id=packet_id,
                sender=sender,
                amount=amount,
                count=count,
                recipients=None if recipients is None else frozenset(recipients),
                password=password,
                sender_may_grab=sender_may_grab,
                expires_at_s=self.now_s + expires_in_s,
                shares=commitment.shares,
                sha256=commitment.sha256,
            )
        )

    @precondition(lambda self: self.packets)
    @rule(
        index=st.integers(0, PACKETS_AT_MOST - 1),
        tries=st.lists(st.tuples(PERSON, GIVEN), min_size=1, max_size=4),
    )
    def grabs(self, index: int, tries: list[tuple[str, str]]) -> None:
        for user, given in tries:
            self.grab(self.packet(index), user, given)

    @precondition(lambda self: self.packets)
    @rule(index=st.integers(0, PACKETS_AT_MOST - 1), user=PERSON, times=st.integers(1, 6))
    def wrong_passwords(self, index: int, user: str, times: int) -> None:
        for _ in range(times):
            self.grab(self.packet(index), user, "wrong")

    def grab(self, p: Model, user: str, given: str) -> None:
        """One grab, its answer the model's."""
        password = {"right": p.password or "sesame", "wrong": "open up", "none": None}[given]
        expected, detail = self.predict_grab(p, user, password)
        code, answer = self.answer(self.services.packets.grabs.grab(p.packet_id, user, password))
        if code == "ok":
            code = answer["status"]
        assert code == expected, (p, user, given, code, answer)
        event(f"grab: {code}")
        if expected == "grabbed":
            remaining = p.count - len(p.grabs)
            assert answer == {
                "status": "grabbed",
                "amount_cents": detail,
                "remaining_count": remaining,
            }
        elif expected == "already_grabbed":
            assert answer == {"status": "already_grabbed", "amount_cents": detail}
        elif expected == "wrong_password":
            assert answer.extra == {"attempts_left": detail}, (answer.extra, detail)

    def predict_grab(self, p: Model, user: str, password: str | None) -> tuple[str, int | None]:
        """The answer the packet owes this grab (SPEC §3), and the model changed by it."""
        before = p.grabbed().get(user)
        if before is not None:
            return "already_grabbed", before
        if user == p.sender and not p.sender_may_grab:
            return "sender_cannot_grab", None
        if p.recipients is not None and user not in p.recipients:
            return "not_a_recipient", None
        if p.status in ENDED:
            return p.status, None
        if p.password is not None:
            if p.wrong[user] >= WRONG_PASSWORDS_ALLOWED:
                return "password_locked", None
            if password != p.password:
                if password is not None:  # a wrong one is counted, a missing one is not
                    p.wrong[user] += 1
                return "wrong_password", WRONG_PASSWORDS_ALLOWED - p.wrong[user]
        share = p.shares[len(p.grabs)]
        p.grabs.append((user, share))
        self.balances[user] += share
        if len(p.grabs) == p.count:
            p.status = "sold_out"
        return "grabbed", share

    @precondition(lambda self: self.packets)
    @rule(index=st.integers(0, PACKETS_AT_MOST - 1), who=PERSON)
    def withdraw(self, index: int, who: str) -> None:
        p = self.packet(index)
        code, answer = self.answer(self.services.packets.withdrawals.withdraw(p.packet_id, who))
        event(f"withdraw: {code}")
        if who != p.sender:
            assert code == "not_the_sender", (p, who, code)
        elif p.status in ("sold_out", "expired"):
            assert code == "packet_ended" and answer.extra == {"packet_status": p.status}, (p, code)
        else:
            if p.status == "active":
                self.end(p, "withdrawn")
            assert code == "ok", (p, code, answer)
            assert answer["status"] == "withdrawn" and answer["refunded_cents"] == p.refunded

    @rule(seconds=st.sampled_from([1, 5, 11, 31, 61]), sweep=st.booleans())
    def time_passes(self, seconds: int, sweep: bool) -> None:
        self.services.clock.advance(seconds)
        self.now_s += seconds
        due = [p for p in self.packets if p.status == "active" and self.now_s >= p.expires_at_s]
        for p in due:
            self.end(p, "expired")
        if sweep:
            swept = self.run(self.services.packets.sweeps.expire_due())
            assert swept == {"due": len(due), "expired": len(due)}, (swept, due)

    @precondition(lambda self: self.packets)
    @rule(
        index=st.integers(0, PACKETS_AT_MOST - 1),
        tries=st.lists(st.tuples(PERSON, GIVEN), max_size=4),
    )
    def redis_loses_everything(self, index: int, tries: list[tuple[str, str]]) -> None:
        """FLUSHALL at a quiescent point, then grabs: a live packet comes back from SQL with
        its undrawn committed shares, an ended one is answered from SQL. Wrong-password
        counts lived only in Redis."""
        self.run(self.services.packets.writer.drain_all())
        self.run(self.services.redis.flushall())
        for p in self.packets:
            p.wrong.clear()
        for user, given in tries:
            self.grab(self.packet(index), user, given)

    def end(self, p: Model, status: str) -> None:
        """The packet ends now with what is left back to its sender."""
        p.status, p.refunded = status, p.left()
        self.balances[p.sender] += p.refunded

    # -- the guarantees ------------------------------------------------------------------

    async def commitment(self, packet_id: str) -> Commitment:
        """The packet's committed shares as SQL keeps them (packet_contents)."""
        async with self.services.database.sessions() as session:
            kept = await session.get(PacketContentsRow, packet_id)
        assert kept is not None, packet_id
        return Commitment.unpack(kept.shares, kept.shares_salt)

    async def recorded(self, packet_id: str) -> tuple[PacketRow, list[tuple[str, int]]]:
        """The packet's SQL row and its grab rows in grab order."""
        async with self.services.database.sessions() as session:
            row = await session.get(PacketRow, packet_id)
            rows = await session.scalars(
                select(GrabRow).where(GrabRow.packet_id == packet_id).order_by(GrabRow.seq)
            )
            grabs = [(g.user_id, g.amount_cents) for g in rows]
        assert row is not None, packet_id
        return row, grabs

    @invariant()
    def the_guarantees_hold(self) -> None:
        packets = self.services.packets
        bodies = {p.packet_id: self.run(packets.reads.get(p.packet_id)) for p in self.packets}
        self.run(packets.writer.drain_all())  # a quiescent point: SQL has every record
        for p in self.packets:
            body = bodies[p.packet_id]
            grabs = [(g["user_id"], g["amount_cents"]) for g in body["grabs"]]
            amounts = [amount for _, amount in grabs]
            assert body["status"] == p.status and grabs == p.grabs, (body, p)
            # §4.3
            assert len(grabs) <= p.count and len({user for user, _ in grabs}) == len(grabs)
            assert all(amount >= 1 for amount in amounts) and sum(amounts) <= p.amount
            assert body["remaining_count"] == p.count - len(grabs)
            assert body["remaining_cents"] == p.amount - sum(amounts)
            if p.status == "sold_out":
                assert sum(amounts) == p.amount, body
            assert body["refunded_cents"] == p.refunded, (body, p)
            if p.status in ("expired", "withdrawn"):
                assert sum(amounts) + body["refunded_cents"] == p.amount, body
            # §4.14: SQL's commitment while live, the revealed one once ended
            commitment = self.run(self.commitment(p.packet_id))
            assert commitment.sha256 == body["shares_sha256"] == p.sha256
            by_seq = list(enumerate(amounts, 1))  # drained before every loss: no seq is skipped
            assert holds(commitment.shares, by_seq), (commitment, amounts)
            if p.status in ENDED:
                shares, salt = body["shares"], body["salt"]
                assert shares is not None and salt is not None, body
                revealed = Commitment(tuple(shares), bytes.fromhex(salt))
                assert revealed.sha256 == p.sha256 and holds(revealed.shares, by_seq)
            else:
                assert body["shares"] is None and body["salt"] is None, body
            # SQL has the same grabs in the same order, and the packet's end and refund
            row, recorded = self.run(self.recorded(p.packet_id))
            assert recorded == p.grabs, (recorded, p)
            assert (row.status, row.refunded_cents) == (p.status, p.refunded), (row, p)
        # §4.4, and each person's money is the model's
        for person in PEOPLE:
            account = self.run(packets.accounts.account(person))
            assert account["balance_cents"] == self.balances[person], (person, account)
        self.run(assert_money_conserved(self.services))


TestPacketMachine = PacketMachine.TestCase
TestPacketMachine.settings = hypothesis_settings(
    max_examples=20, stateful_step_count=25, deadline=None, phases=PHASES
)
