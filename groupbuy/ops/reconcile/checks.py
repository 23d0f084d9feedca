"""The reads of reconciliation: each packet or team from Redis, then from SQL.

Redis is read first and the outbox stream last, so an empty stream means every grab or
member read from Redis is already in SQL when SQL is read. The comparisons themselves
are in groupbuy/ops/reconcile/rules.py.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from sqlalchemy import (
    and_,
    case,
    distinct,
    func,
    select,
    tuple_,
)
from sqlalchemy.orm import aliased

from groupbuy.locks import codec as team_codec
from groupbuy.locks.models import ActivityRow, ActivityRulesRow, MemberRow, TeamRow
from groupbuy.ops.reconcile import rules
from groupbuy.ops.reconcile.rules import GrabDetails, Held, Live, Mismatch
from groupbuy.redpacket import codec as packet_codec
from groupbuy.redpacket.commitment import Commitment
from groupbuy.redpacket.models import GrabRow, LedgerEntryRow, PacketContentsRow, PacketRow
from groupbuy.storage.clock import RedisClock
from groupbuy.storage.db import Database
from groupbuy.storage.deadletters import DeadLetterRow
from groupbuy.storage.keys import Keys

T = TypeVar("T")

CHUNK = 200  # ids per SQL IN list and per Redis pipeline


@dataclass
class CheckPass:
    """What one pass over some packets or teams found."""

    checked: int = 0
    pending: int = 0  # records still in outbox streams
    users: set[str] = field(default_factory=set)  # accounts the packets' entries touch
    mismatches: list[Mismatch] = field(default_factory=list)


def chunks(items: Sequence[T], size: int = CHUNK) -> Iterator[Sequence[T]]:
    """`items` in slices of at most `size`."""
    for start in range(0, len(items), size):
        yield items[start : start + size]


def _grab_cents(value: str) -> int | None:
    """A grab's amount from its Redis value; None when the value is malformed."""
    try:
        return packet_codec.parse_grab(value).amount_cents
    except ValueError:
        return None


def _member_order(value: str) -> str | None:
    """A member's order id from its Redis value ('' and a malformed value: None)."""
    try:
        return team_codec.parse_member(value).order_id
    except ValueError:
        return None


class _Checks:
    """What both kinds of check read: Redis with its key names, and SQL."""

    def __init__(self, redis: Any, database: Database, keys: Keys) -> None:
        self._redis = redis
        self._db = database
        self._keys = keys


class PacketChecks(_Checks):
    """Each packet: its SQL invariants and ledger entries, then Redis against SQL."""

    async def __call__(self, packet_ids: Sequence[str]) -> CheckPass:
        """Check packets: Redis first, then SQL, a chunk at a time."""
        result = CheckPass()
        for chunk in chunks(packet_ids):
            live = await self._snapshots(chunk)  # Redis first, then SQL
            records = await self._records(chunk)
            detailed = [
                pid
                for pid, record in records.items()
                if record["matched"] != record["grabs"]
                or (live[pid].fields and not live[pid].pending)
            ]
            async with self._db.sessions() as session:
                result.users.update(
                    await session.scalars(
                        select(GrabRow.user_id).where(GrabRow.packet_id.in_(chunk)).distinct()
                    )
                )
                details = await _grab_details(session, detailed)
                dead = await _dead_grabs(session, detailed)
            for pid in chunk:
                result.pending += live[pid].pending
                record = records.get(pid)
                if record is None:
                    continue  # named by a ledger key or event, but never recorded as a packet
                result.checked += 1
                result.users.add(record["sender_id"])
                result.mismatches += rules.packet_sql(record, details.get(pid, {}))
                result.mismatches += rules.packet_redis(
                    record, live[pid], details.get(pid, {}), dead.get(pid)
                )
            result.mismatches += await self._commitments(chunk)
        return result

    async def _commitments(self, chunk: Sequence[str]) -> list[Mismatch]:
        """Each packet's grab rows against its committed shares, by seq (packets sent before
        commitments have none to check)."""
        async with self._db.sessions() as session:
            kept = {
                row.packet_id: (Commitment.unpack(row.shares, row.shares_salt), digest)
                for row, digest in (
                    await session.execute(
                        select(PacketContentsRow, PacketRow.shares_sha256)
                        .join(PacketRow, PacketRow.packet_id == PacketContentsRow.packet_id)
                        .where(PacketContentsRow.packet_id.in_(chunk))
                    )
                ).all()
            }
            grabbed: dict[str, list[tuple[int, int]]] = {packet_id: [] for packet_id in kept}
            rows = await session.execute(
                select(GrabRow.packet_id, GrabRow.seq, GrabRow.amount_cents).where(
                    GrabRow.packet_id.in_(list(kept))
                )
            )
            for packet_id, seq, cents in rows:
                grabbed[packet_id].append((seq, cents))
        found: list[Mismatch] = []
        for packet_id, (commitment, digest) in kept.items():
            found += rules.packet_commitment(packet_id, commitment, digest, grabbed[packet_id])
        return found

    async def _snapshots(self, chunk: Sequence[str]) -> dict[str, Live]:
        async with self._redis.pipeline(transaction=False) as pipe:
            for packet_id in chunk:
                packet_keys = self._keys.packet_keys(packet_id)
                packet, grabs = packet_keys.hash, packet_keys.grabs
                pipe.hgetall(packet).hgetall(grabs)
                # The stream last: empty then means every grab read before is in SQL.
                pipe.xlen(self._keys.packet_outbox(packet_id))
            replies = await pipe.execute()
        live = {}
        for i, packet_id in enumerate(chunk):
            fields, grabs, pending = replies[3 * i : 3 * i + 3]
            amounts = {user: _grab_cents(value) for user, value in grabs.items()}
            live[packet_id] = Live(dict(fields), amounts, int(pending))
        return live

    async def _records(self, chunk: Sequence[str]) -> dict[str, dict[str, Any]]:
        """Each packet with its grab totals and ledger entries, in one statement (one snapshot)."""
        grab, credit = GrabRow, aliased(LedgerEntryRow)
        debit, refund = aliased(LedgerEntryRow), aliased(LedgerEntryRow)
        matched = case(
            (
                and_(credit.user_id == grab.user_id, credit.amount_cents == grab.amount_cents),
                1,
            ),
            else_=0,
        )
        grabs = (
            select(
                grab.packet_id,
                func.count().label("grabs"),
                func.sum(grab.amount_cents).label("grabbed"),
                func.min(grab.amount_cents).label("smallest"),
                func.sum(matched).label("matched"),
            )
            .select_from(grab)
            .outerjoin(
                credit,
                credit.business_key
                == packet_codec.grab_credit_key_sql(grab.packet_id, grab.user_id),
            )
            .where(grab.packet_id.in_(chunk))
            .group_by(grab.packet_id)
            .subquery()
        )
        query = (
            select(
                PacketRow.packet_id,
                PacketRow.sender_id,
                PacketRow.amount_cents,
                PacketRow.count,
                PacketRow.status,
                PacketRow.refunded_cents,
                grabs.c.grabs,
                grabs.c.grabbed,
                grabs.c.smallest,
                grabs.c.matched,
                debit.user_id.label("debit_user"),
                debit.amount_cents.label("debit_cents"),
                refund.user_id.label("refund_user"),
                refund.amount_cents.label("refund_cents"),
            )
            .select_from(PacketRow)
            .outerjoin(grabs, grabs.c.packet_id == PacketRow.packet_id)
            .outerjoin(
                debit, debit.business_key == packet_codec.packet_debit_key_sql(PacketRow.packet_id)
            )
            .outerjoin(
                refund, refund.business_key == packet_codec.refund_key_sql(PacketRow.packet_id)
            )
            .where(PacketRow.packet_id.in_(chunk))
        )
        async with self._db.sessions() as session:
            rows = (await session.execute(query)).mappings().all()
        records = {}
        for row in rows:
            record = dict(row)
            for name in ("grabs", "grabbed", "matched"):
                record[name] = int(record[name] or 0)
            records[record["packet_id"]] = record
        return records


class TeamChecks(_Checks):
    """Each team: its member rows, then Redis against SQL."""

    async def __call__(self, teams: Sequence[tuple[str, str]]) -> CheckPass:
        """Check teams: Redis first, then SQL, a chunk at a time."""
        result = CheckPass()
        counted: set[str] = set()
        for chunk in chunks(teams):
            live = await self._snapshots(chunk)
            records = await self._records(chunk)
            compared = [key for key in chunk if live[key].fields and not live[key].pending]
            members = await self._members(compared)
            for key in chunk:
                activity_id = key[0]
                if activity_id not in counted:  # one stream per activity
                    counted.add(activity_id)
                    result.pending += live[key].pending
                record = records.get(key)
                if record is None:
                    continue
                result.checked += 1
                result.mismatches += rules.team(record, live[key], members.get(key, {}))
        return result

    async def _snapshots(self, chunk: Sequence[tuple[str, str]]) -> dict[tuple[str, str], Live]:
        keys = self._keys
        async with self._redis.pipeline(transaction=False) as pipe:
            for activity_id, team_id in chunk:
                pipe.hgetall(keys.team(activity_id, team_id))
                pipe.hgetall(keys.team_members(activity_id, team_id))
                pipe.xlen(keys.outbox(activity_id))
            replies = await pipe.execute()
        live = {}
        for i, key in enumerate(chunk):
            fields, members, pending = replies[3 * i : 3 * i + 3]
            orders = {user: _member_order(value) for user, value in members.items()}
            live[key] = Live(dict(fields), orders, int(pending))
        return live

    async def _records(
        self, chunk: Sequence[tuple[str, str]]
    ) -> dict[tuple[str, str], dict[str, Any]]:
        """Each team with its member count and distinct seqs, in one statement."""
        counts = (
            select(
                MemberRow.activity_id,
                MemberRow.team_id,
                func.count().label("members"),
                func.count(distinct(MemberRow.seq)).label("seqs"),
            )
            .where(
                tuple_(MemberRow.activity_id, MemberRow.team_id).in_(chunk),
                MemberRow.left_at.is_(None),  # who left an open team is out of it
            )
            .group_by(MemberRow.activity_id, MemberRow.team_id)
            .subquery()
        )
        query = (
            select(
                TeamRow.activity_id,
                TeamRow.team_id,
                TeamRow.status,
                TeamRow.size,
                counts.c.members,
                counts.c.seqs,
                ActivityRulesRow.virtual_min_members.label("virtual_min"),
            )
            .select_from(TeamRow)
            .outerjoin(ActivityRulesRow, ActivityRulesRow.activity_id == TeamRow.activity_id)
            .outerjoin(
                counts,
                and_(
                    counts.c.activity_id == TeamRow.activity_id,
                    counts.c.team_id == TeamRow.team_id,
                ),
            )
            .where(tuple_(TeamRow.activity_id, TeamRow.team_id).in_(chunk))
        )
        async with self._db.sessions() as session:
            rows = (await session.execute(query)).mappings().all()
        records = {}
        for row in rows:
            record = dict(row)
            for name in ("members", "seqs"):
                record[name] = int(record[name] or 0)
            records[(record["activity_id"], record["team_id"])] = record
        return records

    async def _members(
        self, teams: Sequence[tuple[str, str]]
    ) -> dict[tuple[str, str], dict[str, str | None]]:
        members: dict[tuple[str, str], dict[str, str | None]] = {}
        if not teams:
            return members
        async with self._db.sessions() as session:
            rows = await session.execute(
                select(
                    MemberRow.activity_id, MemberRow.team_id, MemberRow.user_id, MemberRow.order_id
                ).where(
                    tuple_(MemberRow.activity_id, MemberRow.team_id).in_(teams),
                    MemberRow.left_at.is_(None),
                )
            )
            for activity_id, team_id, user_id, order_id in rows:
                members.setdefault((activity_id, team_id), {})[user_id] = order_id or None
        return members


class StockChecks(_Checks):
    """Each activity's stock (SPEC §4.12): Redis's held units and SQL's member rows within
    it, and Redis's stock equal to SQL's. Activities with no stock on either side pass."""

    def __init__(self, redis: Any, database: Database, keys: Keys, clock: RedisClock) -> None:
        super().__init__(redis, database, keys)
        self._clock = clock

    async def __call__(self, activity_ids: Sequence[str]) -> CheckPass:
        """Check activities: Redis first, then SQL, a chunk at a time."""
        result = CheckPass()
        for chunk in chunks(activity_ids):
            live = await self._held(chunk)
            records = await self._records(chunk)
            for activity_id in chunk:
                if activity_id not in records:
                    continue
                result.checked += 1
                sql_stock, sql_members = records[activity_id]
                result.mismatches += rules.stock(
                    activity_id, sql_stock, sql_members, live[activity_id]
                )
        return result

    async def _held(self, chunk: Sequence[str]) -> dict[str, Held | None]:
        keys = self._keys
        now = await self._clock.now_ms(self._redis)
        async with self._redis.pipeline(transaction=False) as pipe:
            for activity_id in chunk:
                pipe.hmget(keys.activity(activity_id), "team_size", "stock")
                pipe.hget(keys.activity_counts(activity_id), "members")
                pipe.zcount(keys.lock_expiries(activity_id), f"({now}", "+inf")
            replies = await pipe.execute()
        held: dict[str, Held | None] = {}
        for i, activity_id in enumerate(chunk):
            (size, stock), members, locks = replies[3 * i : 3 * i + 3]
            held[activity_id] = (
                None
                if size is None  # Redis let the activity's copy go: nothing held there
                else Held(rules.as_int(stock) or None, rules.as_int(members) or 0, int(locks))
            )
        return held

    async def _records(self, chunk: Sequence[str]) -> dict[str, tuple[int | None, int]]:
        """Each activity's stock and the member rows that hold a unit, in one statement."""
        held = (
            select(MemberRow.activity_id, func.count().label("members"))
            .join(
                TeamRow,
                and_(
                    TeamRow.activity_id == MemberRow.activity_id,
                    TeamRow.team_id == MemberRow.team_id,
                ),
            )
            .where(
                MemberRow.activity_id.in_(chunk),
                TeamRow.status.in_(("open", "formed")),
                MemberRow.left_at.is_(None),
                MemberRow.refunded_at.is_(None),
            )
            .group_by(MemberRow.activity_id)
            .subquery()
        )
        query = (
            select(ActivityRow.activity_id, ActivityRulesRow.stock, held.c.members)
            .select_from(ActivityRow)
            .outerjoin(ActivityRulesRow, ActivityRulesRow.activity_id == ActivityRow.activity_id)
            .outerjoin(held, held.c.activity_id == ActivityRow.activity_id)
            .where(ActivityRow.activity_id.in_(chunk))
        )
        async with self._db.sessions() as session:
            rows = (await session.execute(query)).all()
        return {aid: (stock, int(members or 0)) for aid, stock, members in rows}


async def _grab_details(session: Any, packet_ids: Sequence[str]) -> dict[str, GrabDetails]:
    """Grab rows with their credit: packet -> user -> (cents, credit user, credit cents)."""
    details: dict[str, GrabDetails] = {}
    credit = aliased(LedgerEntryRow)
    for chunk in chunks(packet_ids):
        rows = await session.execute(
            select(
                GrabRow.packet_id,
                GrabRow.user_id,
                GrabRow.amount_cents,
                credit.user_id,
                credit.amount_cents,
            )
            .select_from(GrabRow)
            .outerjoin(
                credit,
                credit.business_key
                == packet_codec.grab_credit_key_sql(GrabRow.packet_id, GrabRow.user_id),
            )
            .where(GrabRow.packet_id.in_(chunk))
        )
        for packet_id, user_id, cents, credit_user, credit_cents in rows:
            details.setdefault(packet_id, {})[user_id] = (int(cents), credit_user, credit_cents)
    return details


async def _dead_grabs(session: Any, packet_ids: Sequence[str]) -> dict[str, dict[str, int]]:
    """Grab records SQL refused, kept as dead letters: packet -> user -> dead letter id."""
    dead: dict[str, dict[str, int]] = {}
    for chunk in chunks(packet_ids):
        rows = await session.execute(
            select(DeadLetterRow.owner_id, DeadLetterRow.user_id, DeadLetterRow.id).where(
                DeadLetterRow.stream == "packets",
                DeadLetterRow.record_type == "grab",
                DeadLetterRow.owner_id.in_(chunk),
            )
        )
        for packet_id, user_id, row_id in rows:
            if user_id is not None:
                dead.setdefault(packet_id, {})[user_id] = int(row_id)
    return dead
