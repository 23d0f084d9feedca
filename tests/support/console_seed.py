"""A big database for the console: activities with teams in every status, packets
active, sold out and expired from many senders, ledger entries, events and audit rows.

The rows go into SQL in bulk (one INSERT of many rows at a time); the live Redis state of
the open teams and active packets is then rebuilt by the service's own recovery
(`TeamRecovery.restore`, `RecoveryService.restore`), the path it takes after Redis lost
data, so Redis holds what the service would hold. The ended ones stay in SQL only, as
after the repair job released them. Every activity's live counts (`{a:<aid>}:counts`)
are put in Redis from SQL's, as a listing puts back those Redis has none of: the pages
then read counts in place, as they do once an activity has been listed.

tests/console/test_seeded_pages.py reads every page of `pages` on a small one;
benchmarks/console_cost.py times them on 10,000 activities.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import insert

from groupbuy.locks.models import ActivityRow, MemberRow, TeamRow
from groupbuy.ops.audit import AuditRow
from groupbuy.redpacket.models import AccountRow, GrabRow, LedgerEntryRow, PacketRow
from groupbuy.services import Services
from groupbuy.storage.events import EventRow

RESTORE_AT_ONCE = 32
COUNTS_AT_ONCE = 500  # activities whose counts are put back in one go
TEAM_SIZE = 5
PACKET_CENTS = 1000
WHALE = "whale"  # the sender of many packets, for deep pages of one sender's listing


@dataclass(frozen=True)
class Scale:
    """How much to seed."""

    activities: int
    packets: int
    senders: int
    live_activities: int  # the newest activities with open teams (live in Redis)
    active_packets: int  # the newest packets still active (live in Redis)
    events: int
    audit: int


FULL = Scale(10_000, 100_000, 1_000, 200, 1_000, 100_000, 2_000)
QUICK = Scale(10_000, 100_000, 1_000, 50, 200, 20_000, 500)


@dataclass(frozen=True)
class Seeded:
    """Ids the benchmark pages read."""

    live_activity: str
    closed_activity: str
    open_team: tuple[str, str]
    formed_team: tuple[str, str]
    active_packet: str
    sold_out_packet: str
    whale: str
    counts_keys: tuple[str, ...] = ()  # every activity's live-counts hash in Redis


def _activity_id(i: int) -> str:
    return f"a{i:06d}"


def _packet_id(i: int) -> str:
    return f"p{i:07d}"


def _sender(i: int, scale: Scale) -> str:
    # One packet in ten is the whale's; the rest spread over the other senders.
    return WHALE if i % 10 == 0 else f"s{i % (scale.senders - 1):05d}"


async def bulk_insert(services: Services, model: Any, rows: list[dict[str, Any]]) -> None:
    """Rows into a table by its Core INSERT, 2,000 rows a transaction: the ORM's bulk path
    costs ten times more."""
    for start in range(0, len(rows), 2000):
        async with services.database.transaction() as session:
            await session.execute(insert(model.__table__), rows[start : start + 2000])


async def _teams(services: Services, scale: Scale, now: datetime) -> None:
    """Activities (one in ten closed), each with a formed and a failed team; the newest
    `live_activities` also with two open teams."""
    activities, teams, members = [], [], []
    for i in range(scale.activities):
        aid = _activity_id(i)
        created = now - timedelta(seconds=scale.activities - i)
        closed = i % 10 == 5 and i < scale.activities - scale.live_activities
        activities.append(
            {"activity_id": aid, "name": f"activity {i}", "team_size": TEAM_SIZE,
             "lock_ttl_s": 60, "team_deadline_s": 86_400, "created_at": created,
             "status": "closed" if closed else "open",
             "closed_at": created + timedelta(seconds=1) if closed else None}
        )  # fmt: skip
        statuses = ["formed", "failed"]
        if i >= scale.activities - scale.live_activities:
            statuses += ["open", "open"]
        for n, status in enumerate(statuses):
            tid = f"t{n}"
            joined = 1 if status == "open" else (TEAM_SIZE if status == "formed" else 2)
            teams.append(
                {"activity_id": aid, "team_id": tid, "leader_id": f"u{i}-{n}-1",
                 "status": status, "size": TEAM_SIZE, "created_at": created,
                 "deadline_at": now + timedelta(days=1) if status == "open" else created,
                 "formed_at": created if status == "formed" else None,
                 "failed_at": created if status == "failed" else None,
                 "redis_cleared": status != "open"}
            )  # fmt: skip
            members += [
                {"activity_id": aid, "team_id": tid, "user_id": f"u{i}-{n}-{seq}",
                 "order_id": f"o{i}-{n}-{seq}", "seq": seq, "joined_at": created}
                for seq in range(1, joined + 1)
            ]  # fmt: skip
    await bulk_insert(services, ActivityRow, activities)
    await bulk_insert(services, TeamRow, teams)
    await bulk_insert(services, MemberRow, members)


async def _packets(services: Services, scale: Scale, now: datetime) -> None:
    """Packets: the newest `active_packets` active (ten shares), the others of one share, sold out
    (with their grab) or expired (refunded), every move in the ledger."""
    packets, grabs, entries = [], [], []
    balances: dict[str, int] = {}
    for i in range(scale.packets):
        pid, sender = _packet_id(i), _sender(i, scale)
        created = now - timedelta(milliseconds=10 * (scale.packets - i))
        active = i >= scale.packets - scale.active_packets
        status = "active" if active else ("sold_out" if i % 2 else "expired")
        packets.append(
            {"packet_id": pid, "sender_id": sender, "amount_cents": PACKET_CENTS,
             "count": 10 if active else 1, "strategy": "double_mean", "expires_in_s": 86_400,
             "status": status, "created_at": created,
             "expires_at": now + timedelta(days=1) if active else created,
             "sold_out_at": created if status == "sold_out" else None,
             "expired_at": created if status == "expired" else None,
             "refunded_cents": PACKET_CENTS if status == "expired" else 0,
             "records_done": not active, "redis_cleared": not active}
        )  # fmt: skip
        moves = [("deposit", sender, PACKET_CENTS), ("packet_debit", sender, -PACKET_CENTS)]
        if status == "sold_out":
            taker = f"g{i % 5000:05d}"
            grabs.append(
                {"packet_id": pid, "user_id": taker, "seq": 1, "amount_cents": PACKET_CENTS,
                 "grabbed_at": created}
            )  # fmt: skip
            moves.append(("grab_credit", taker, PACKET_CENTS))
        elif status == "expired":
            moves.append(("refund_credit", sender, PACKET_CENTS))
        for kind, user, cents in moves:
            balances[user] = balances.get(user, 0) + cents
            entries.append(
                {"business_key": f"{kind}:{pid}:{user}", "user_id": user, "kind": kind,
                 "amount_cents": cents, "created_at": created,
                 "balance_after_cents": balances[user]}
            )  # fmt: skip
    await bulk_insert(services, PacketRow, packets)
    await bulk_insert(services, GrabRow, grabs)
    await bulk_insert(services, LedgerEntryRow, entries)
    accounts = [{"user_id": u, "balance_cents": b} for u, b in balances.items()]
    await bulk_insert(services, AccountRow, accounts)


async def _feed_and_audit(services: Services, scale: Scale, now: datetime) -> None:
    kinds = ("packet.grabbed", "team.joined", "team.formed", "packet.sold_out")
    events = [
        {"type": kinds[i % 4], "at": now, "dedup_key": f"seed:{i}", "position": i + 1,
         "data": json.dumps({"packet_id": _packet_id(i % scale.packets),
                             "activity_id": _activity_id(i % scale.activities)})}
        for i in range(scale.events)
    ]  # fmt: skip
    await bulk_insert(services, EventRow, events)
    audit = [
        {"at": now, "actor": "admin:seed", "action": "job.run", "target": "reconcile",
         "reason": f"seeded {i}", "detail": {"n": i}}
        for i in range(scale.audit)
    ]  # fmt: skip
    await bulk_insert(services, AuditRow, audit)


async def _counts(services: Services, scale: Scale) -> list[str]:
    """Every activity's counts into Redis from SQL's, the way a listing puts back those Redis
    has none of (`ActivityCounts.read_many`); the keys of the counts hashes."""
    ids = [_activity_id(i) for i in range(scale.activities)]
    for start in range(0, len(ids), COUNTS_AT_ONCE):
        await services.teams.counts.read_many(ids[start : start + COUNTS_AT_ONCE])
    return [services.keys.activity_counts(aid) for aid in ids]


async def _restore_live(services: Services, scale: Scale) -> None:
    """The open teams and active packets into Redis, as the service rebuilds them."""
    teams = services.teams.recovery
    calls: list[Any] = []
    for i in range(scale.activities - scale.live_activities, scale.activities):
        calls += [teams.restore(_activity_id(i), f"t{n}") for n in (2, 3)]
    packets = services.packets.recovery
    calls += [packets.restore(_packet_id(i))
              for i in range(scale.packets - scale.active_packets, scale.packets)]  # fmt: skip
    for start in range(0, len(calls), RESTORE_AT_ONCE):
        await asyncio.gather(*calls[start : start + RESTORE_AT_ONCE])


async def seed(services: Services, scale: Scale) -> Seeded:
    """Fill an empty, migrated database and its Redis; the ids the pages read."""
    now = datetime.now(UTC)
    await _teams(services, scale, now)
    await _packets(services, scale, now)
    await _feed_and_audit(services, scale, now)
    counts_keys = await _counts(services, scale)
    await _restore_live(services, scale)
    last = scale.activities - 1
    closed = next(
        i
        for i in range(last, -1, -1)
        if i % 10 == 5 and i < scale.activities - scale.live_activities
    )
    return Seeded(
        live_activity=_activity_id(last),
        closed_activity=_activity_id(closed),
        open_team=(_activity_id(last), "t2"),
        formed_team=(_activity_id(last), "t0"),
        active_packet=_packet_id(scale.packets - 1),
        sold_out_packet=_packet_id(scale.packets - scale.active_packets - 1),
        whale=WHALE,
        counts_keys=tuple(counts_keys),
    )


def pages(seeded: Seeded) -> list[tuple[str, str | None]]:
    """(path, the key of a cursor to follow, or None) of every listing and console page."""
    aid, (tid_aid, tid), (fid_aid, fid) = seeded.live_activity, seeded.open_team, seeded.formed_team
    return [
        ("/v1/activities?limit=100", None),
        ("/v1/activities?limit=100", "next_cursor"),
        ("/v1/activities?status=open&limit=100", None),
        ("/v1/activities?status=closed&limit=100", None),
        ("/v1/activities?status=closed&limit=100", "next_cursor"),
        (f"/v1/activities/{aid}", None),
        (f"/v1/activities/{aid}/teams?limit=100", None),
        (f"/v1/activities/{aid}/teams?has_free_seats=false&limit=100", None),
        (f"/v1/activities/{fid_aid}/teams?status=formed&limit=100", None),
        (f"/v1/activities/{fid_aid}/teams?status=failed&limit=100", None),
        ("/v1/redpackets?limit=100", None),
        ("/v1/redpackets?limit=100", "next_cursor"),
        ("/v1/redpackets?status=active&limit=100", None),
        ("/v1/redpackets?status=sold_out&limit=100", None),
        ("/v1/redpackets?status=expired&limit=100", "next_cursor"),
        (f"/v1/redpackets?sender_id={seeded.whale}&limit=100", None),
        (f"/v1/redpackets?sender_id={seeded.whale}&limit=100", "next_cursor"),
        (f"/v1/accounts/{seeded.whale}/entries?limit=100", None),
        (f"/v1/accounts/{seeded.whale}/entries?limit=100", "next_cursor"),
        ("/v1/admin/audit?limit=100", None),
        ("/v1/admin/audit?limit=100", "next_cursor"),
        ("/console", None),
        ("/console/events", None),
        ("/console/events?type=team.formed", None),
        ("/console/events?after=1000", None),
        ("/console/activities", None),
        ("/console/activities?status=closed", None),
        ("/console/redpackets", None),
        ("/console/redpackets?status=active", None),
        (f"/console/activities/{aid}", None),
        (f"/console/activities/{aid}?teams=full", None),  # the teams full of locks
        (f"/console/activities/{seeded.closed_activity}", None),
        (f"/console/activities/{tid_aid}/teams/{tid}", None),
        (f"/console/activities/{fid_aid}/teams/{fid}", None),
        (f"/console/redpackets/{seeded.active_packet}", None),
        (f"/console/redpackets/{seeded.sold_out_packet}", None),
        ("/console/integrity", None),
        ("/console/webhooks", None),
        ("/console/audit", None),
        ("/console/blocked-users", None),
        ("/console/live.json?page=overview", None),
        (f"/console/live.json?page=activity&id={aid}", None),
        (f"/console/live.json?page=packet&id={seeded.active_packet}", None),
        ("/console/live.json?page=events&after=1000", None),
    ]
