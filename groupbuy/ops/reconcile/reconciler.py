"""Reconciliation (对账): compare Redis, the grab rows and the ledger; report, never fix.

A run checks every packet, team and account touched since the previous run (all of
them on the first run) and stores a report of every mismatch. "Touched" is decided
twice over: by time (rows created or ended at or after the previous run's start) and
by write order (ledger entries and events with ids above the previous run's
watermarks), because an ending is recorded with the time it took effect, which a late
writer or a lazy expiry may put before the previous run.

Live traffic makes any two reads disagree for a moment, so:
- Redis is read before SQL, and a packet or team whose outbox stream still holds
  records is not compared with SQL at all (its records are counted as pending);
- every packet or team with a mismatch is checked a second time, and only mismatches
  found both times are reported: a race shows once, a real difference persists;
- invariants that must hold within SQL are read by single statements (one snapshot).
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Hashable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, TypeVar

from groupbuy_client.wire import from_ms, iso_ms, to_ms
from sqlalchemy import (
    func,
    literal,
    or_,
    select,
    tuple_,
    union_all,
)

from groupbuy.locks import records as team_records
from groupbuy.locks.models import TeamRow
from groupbuy.locks.waitlist_records import ANY_TEAM
from groupbuy.ops.reconcile import rules
from groupbuy.ops.reconcile.acks import unrecorded_acks
from groupbuy.ops.reconcile.checks import (
    CheckPass,
    PacketChecks,
    StockChecks,
    TeamChecks,
    chunks,
)
from groupbuy.ops.reconcile.rules import Findings, Mismatch
from groupbuy.ops.reconcile.table import ReconcileReportRow
from groupbuy.redpacket import codec as packet_codec
from groupbuy.redpacket import records as packet_records
from groupbuy.redpacket.models import AccountRow, GrabRow, LedgerEntryRow, PacketRow
from groupbuy.storage.clock import RedisClock
from groupbuy.storage.db import Database
from groupbuy.storage.events import EventRow, assign_positions
from groupbuy.storage.keys import Keys

S = TypeVar("S", bound=Hashable)

_PAGE = 5000  # ledger entries / events read per page
MAX_LISTED = 1000  # mismatches listed in one report (all are counted)
_LIVE = ("active", "pending")
_SCANNED_EVENTS = (
    "packet.sent",
    "packet.sold_out",
    "packet.refunded",
    "team.opened",
    "team.member_joined",
    "team.formed",
    "team.failed",
)


@dataclass(frozen=True)
class _Cursor:
    since: datetime
    ledger_id: int
    event_id: int


@dataclass
class _Touched:
    packets: set[str] = field(default_factory=set)
    teams: set[tuple[str, str]] = field(default_factory=set)
    users: set[str] | None = None  # None: every account
    orphan_credits: list[Mismatch] = field(default_factory=list)


def _identity(m: Mismatch) -> tuple[Any, ...]:
    return tuple(m.get(k) for k in ("kind", "packet_id", "activity_id", "team_id", "user_id"))


def _touch_by_event(key: str, touched: _Touched) -> None:
    """Add the packet or team an event's dedup key names (each engine's codec reads its own)."""
    try:
        packet = packet_records.parse_event_key(key)
        team = None if packet else team_records.parse_event_key(key)
    except ValueError:  # malformed: it names nothing that can be checked
        return
    if packet is not None:
        touched.packets.add(packet.packet_id)
    elif team is not None and team.team_id != ANY_TEAM:  # (a waitlist entry for any team)
        touched.teams.add((team.activity_id, team.team_id))


class Reconciler:
    """Checks Redis against SQL and the ledger against balances, and keeps the reports."""

    def __init__(
        self, redis: Any, database: Database, keys: Keys, clock: RedisClock | None = None
    ) -> None:
        self._redis = redis
        self._db = database
        self._keys = keys
        self._packets = PacketChecks(redis, database, keys)
        self._teams = TeamChecks(redis, database, keys)
        # The scripts' clock (with its test shift), so "since" compares like with like.
        self._clock = clock or RedisClock()
        self._stock = StockChecks(redis, database, keys, self._clock)

    async def latest(self) -> dict[str, Any] | None:
        """The newest stored report, or None before the first run."""
        row = await self._newest()
        return None if row is None else dict(json.loads(row.report))

    async def run(self) -> dict[str, Any]:
        """Check what was touched since the last run; store and return the report."""
        started_ms = await self._clock.now_ms(self._redis)
        newest = await self._newest()
        previous = (
            None
            if newest is None
            else _Cursor(
                from_ms(to_ms(newest.started_at)), newest.ledger_watermark, newest.event_watermark
            )
        )
        # Events are scanned by feed position, not id: an event that commits after this read
        # with an id below the watermark would be passed over by the next run; positions
        # are only given after commit, above every one given before.
        await assign_positions(self._db)
        async with self._db.sessions() as session:
            ledger_id, event_id = (
                await session.execute(
                    select(
                        select(func.coalesce(func.max(LedgerEntryRow.id), 0)).scalar_subquery(),
                        select(func.coalesce(func.max(EventRow.position), 0)).scalar_subquery(),
                    )
                )
            ).one()
        touched = await self._touched(previous, int(ledger_id), int(event_id))
        packets = await self._confirmed(
            self._packets, sorted(touched.packets), lambda m: str(m["packet_id"])
        )
        teams = await self._confirmed(
            self._teams, sorted(touched.teams), lambda m: (m["activity_id"], m["team_id"])
        )
        # The stock of every activity a touched team belongs to (SPEC §4.12).
        stock = await self._confirmed(
            self._stock,
            sorted({activity_id for activity_id, _team in touched.teams}),
            lambda m: str(m["activity_id"]),
        )
        users = None if touched.users is None else touched.users | packets.users
        accounts_checked, account_mismatches = await self._check_accounts(users)
        lost_acks = await unrecorded_acks(self._redis, self._db, self._keys, MAX_LISTED)
        mismatches = [
            *lost_acks,
            *touched.orphan_credits,
            *packets.mismatches,
            *teams.mismatches,
            *stock.mismatches,
            *account_mismatches,
        ]
        finished_ms = await self._clock.now_ms(self._redis)
        report: dict[str, Any] = {
            "started_at": iso_ms(started_ms),
            "finished_at": iso_ms(finished_ms),
            "since": None if previous is None else iso_ms(to_ms(previous.since)),
            "packets_checked": packets.checked,
            "teams_checked": teams.checked,
            "accounts_checked": accounts_checked,
            "pending_records": packets.pending + teams.pending,
            "mismatch_count": len(mismatches),
            "mismatches": mismatches[:MAX_LISTED],
        }
        async with self._db.transaction() as session:
            row = ReconcileReportRow(
                started_at=from_ms(started_ms),
                finished_at=from_ms(finished_ms),
                ledger_watermark=int(ledger_id),
                event_watermark=int(event_id),
                report="{}",
            )
            session.add(row)
            await session.flush()
            report = {"id": row.id, **report}
            row.report = json.dumps(report, separators=(",", ":"))
        return report

    async def _newest(self) -> ReconcileReportRow | None:
        async with self._db.sessions() as session:
            return await session.scalar(
                select(ReconcileReportRow)
                .order_by(ReconcileReportRow.started_at.desc(), ReconcileReportRow.id.desc())
                .limit(1)
            )

    @staticmethod
    async def _confirmed(
        check: Callable[[Sequence[S]], Awaitable[CheckPass]],
        subjects: Sequence[S],
        subject_of: Callable[[Mismatch], S],
    ) -> CheckPass:
        """Check twice what looked wrong once; report what was wrong both times."""
        first = await check(subjects)
        suspects = sorted({subject_of(m) for m in first.mismatches}, key=repr)
        if suspects:
            seen = {_identity(m) for m in first.mismatches}
            again = await check(suspects)
            first.mismatches = [m for m in again.mismatches if _identity(m) in seen]
        return first

    # -- what to check ----------------------------------------------------------------

    async def _touched(self, previous: _Cursor | None, ledger_id: int, event_id: int) -> _Touched:
        touched = _Touched(users=None if previous is None else set())
        async with self._db.sessions() as session:
            packets = select(PacketRow.packet_id)
            teams = select(TeamRow.activity_id, TeamRow.team_id)
            if previous is not None:
                since = previous.since
                packets = packets.where(
                    or_(
                        PacketRow.status.in_(_LIVE),
                        PacketRow.created_at >= since,
                        PacketRow.sold_out_at >= since,
                        PacketRow.expired_at >= since,
                    )
                )
                teams = teams.where(
                    or_(
                        TeamRow.status == "open",
                        TeamRow.created_at >= since,
                        TeamRow.formed_at >= since,
                        TeamRow.failed_at >= since,
                    )
                )
                grabbed = select(GrabRow.packet_id).where(GrabRow.grabbed_at >= since).distinct()
                touched.packets.update(await session.scalars(grabbed))
            touched.packets.update(await session.scalars(packets))
            touched.teams.update((a, t) for a, t in await session.execute(teams))
        await self._scan_events(0 if previous is None else previous.event_id, event_id, touched)
        await self._scan_ledger(0 if previous is None else previous.ledger_id, ledger_id, touched)
        return touched

    async def _scan_events(self, after: int, upto: int, touched: _Touched) -> None:
        while after < upto:
            async with self._db.sessions() as session:
                page = (
                    await session.execute(
                        select(EventRow.position, EventRow.dedup_key)
                        .where(
                            EventRow.position > after,
                            EventRow.position <= upto,
                            EventRow.type.in_(_SCANNED_EVENTS),
                        )
                        .order_by(EventRow.position)
                        .limit(_PAGE)
                    )
                ).all()
            if not page:
                return
            for _position, key in page:
                _touch_by_event(key, touched)
            after = page[-1][0] or after  # never null: the query wants position > after

    async def _scan_ledger(self, after: int, upto: int, touched: _Touched) -> None:
        """New entries touch their packets and accounts; new credits must have a grab row."""
        while after < upto:
            async with self._db.sessions() as session:
                page = (
                    await session.execute(
                        select(
                            LedgerEntryRow.id,
                            LedgerEntryRow.business_key,
                            LedgerEntryRow.user_id,
                            LedgerEntryRow.kind,
                            LedgerEntryRow.amount_cents,
                        )
                        .where(LedgerEntryRow.id > after, LedgerEntryRow.id <= upto)
                        .order_by(LedgerEntryRow.id)
                        .limit(_PAGE)
                    )
                ).all()
            if not page:
                return
            credits: dict[tuple[str, str], int] = {}
            for _id, key, user_id, kind, cents in page:
                if touched.users is not None:
                    touched.users.add(user_id)
                try:
                    parsed: packet_codec.BusinessKey | None = packet_codec.parse_business_key(key)
                except ValueError:
                    parsed = None  # not a key this service builds: it names no packet
                packet_id = parsed.packet_id if parsed else None
                if packet_id is not None:
                    touched.packets.add(packet_id)
                if kind == "grab_credit":
                    # under any other key, the credit matches no grab row and is reported
                    user = parsed.user_id if parsed and parsed.user_id else key
                    credits[(packet_id or "", user)] = int(cents)
            # Read after the credits: a grab row commits with its credit, so none is missed.
            touched.orphan_credits += await self._orphan_credits(credits)
            after = page[-1][0]

    async def _orphan_credits(self, credits: dict[tuple[str, str], int]) -> list[Mismatch]:
        pairs = sorted(credits)
        recorded: set[tuple[str, str]] = set()
        async with self._db.sessions() as session:
            for chunk in chunks(pairs):
                rows = await session.execute(
                    select(GrabRow.packet_id, GrabRow.user_id).where(
                        tuple_(GrabRow.packet_id, GrabRow.user_id).in_(chunk)
                    )
                )
                recorded.update((p, u) for p, u in rows)
        found = Findings()
        for packet_id, user_id in pairs:
            if (packet_id, user_id) not in recorded:
                cents = credits[(packet_id, user_id)]
                found.add(
                    "credit_without_grab", packet_id=packet_id, user_id=user_id, credit_cents=cents
                )
        return found

    # -- accounts ---------------------------------------------------------------------

    async def _check_accounts(self, users: set[str] | None) -> tuple[int, list[Mismatch]]:
        """Each balance against the sum of its entries (one statement per chunk of users)."""
        balances: dict[str, int] = {}
        totals: dict[str, int] = {}
        slices: list[Sequence[str] | None] = (
            [None] if users is None else list(chunks(sorted(users)))
        )
        async with self._db.sessions() as session:
            for chunk in slices:
                accounts = select(AccountRow.user_id, literal("balance"), AccountRow.balance_cents)
                entries = select(
                    LedgerEntryRow.user_id,
                    literal("entries"),
                    func.sum(LedgerEntryRow.amount_cents),
                ).group_by(LedgerEntryRow.user_id)
                if chunk is not None:
                    accounts = accounts.where(AccountRow.user_id.in_(chunk))
                    entries = entries.where(LedgerEntryRow.user_id.in_(chunk))
                for user_id, what, cents in await session.execute(union_all(accounts, entries)):
                    (balances if what == "balance" else totals)[user_id] = int(cents or 0)
        return len(balances.keys() | totals.keys()), rules.accounts(balances, totals)
