"""Deliveries in SQL: what is owed and who attempts it. Deliveries are derived from the
events feed; due ones are claimed by one process at a time.

A claim is a token and a deadline on the row (`claim_token`, `claim_until_ms`): two
processes cannot both hold one delivery, and a process killed mid-attempt leaves a claim
that expires, after which another takes the delivery (at least once; the receiver dedups
by `webhook-id`). A live process renews its claims while it holds them, so the deadline
can be short. Derivation and claims run inside a transaction that holds the endpoints'
rows first (read_targets), which serialises them per endpoint: row locks taken in id order
on PostgreSQL, the write lock on SQLite (taken by the sequencer's UPDATE, before the reads
that count what is in flight). Each step is one statement for every endpoint at once, so
a pass costs the same few round trips however many endpoints there are.
"""

from __future__ import annotations

import functools
import json
import secrets
from dataclasses import dataclass
from datetime import datetime
from typing import Any, cast

import orjson
from sqlalchemy import (
    BigInteger,
    BindParameter,
    Select,
    Table,
    and_,
    bindparam,
    func,
    or_,
    select,
    union_all,
    update,
)
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.orm import aliased

from groupbuy.storage.db import Database, named_dialect_insert
from groupbuy.storage.events import EventRow, sequence_in
from groupbuy.storage.many import ManyRows
from groupbuy.webhooks.messages import Bodies
from groupbuy.webhooks.models import DeliveryRow, EndpointRow
from groupbuy.webhooks.store import subscribes

# Events one derivation reads per endpoint: bounds a transaction behind a large backlog.
DERIVE_BATCH = 2000
# A claim token is the claiming process's prefix of this many characters, then a random part.
OWNER_CHARS = 16


def entity_of(event_type: str, data: dict[str, Any]) -> tuple[str, int]:
    """The entity an event belongs to (a team, a packet, an endpoint; '' for none) and its
    version after the event (0 when the event carries none)."""
    version = int(data.get("version", 0) or 0)
    if "team_id" in data:
        return f"team:{data.get('activity_id', '')}/{data['team_id']}", version
    if "packet_id" in data:
        return f"packet:{data['packet_id']}", version
    if "endpoint_id" in data:
        return f"endpoint:{data['endpoint_id']}", version
    return "", version


def webhook_id(position: int) -> str:
    """A delivery's `webhook-id`: the same on every attempt (the receiver's dedup key)."""
    return f"evt_{position}"


@dataclass(frozen=True)
class Claimed:
    """A delivery this process holds, with what its attempt sends."""

    delivery_id: int
    token: str
    endpoint_id: str
    position: int
    event_type: str
    tries: int
    body: bytes

    @property
    def webhook_id(self) -> str:
        """The delivery's `webhook-id`."""
        return webhook_id(self.position)


def delivery_row(
    endpoint_id: str, position: int, event_type: str, data: str, now: int
) -> dict[str, Any]:
    entity, version = entity_of(event_type, orjson.loads(data))
    return {
        "endpoint_id": endpoint_id,
        "event_position": position,
        "event_type": event_type,
        "entity": entity,
        "entity_version": version,
        "status": "pending",
        "tries": 0,
        "next_ms": now,
        "ended_ms": None,
    }


@dataclass(frozen=True)
class Target:
    """An endpoint as a pass reads it: where its deliveries go, how they are signed, what
    it subscribes to, and how far into the feed its deliveries exist."""

    endpoint_id: str
    url: str
    event_types: tuple[str, ...]
    ordering: str
    disabled: bool
    secret: str
    previous_secret: str | None
    previous_until_ms: int | None
    position: int


async def read_targets(session: AsyncSession, is_sqlite: bool) -> tuple[list[Target], int]:
    """Every endpoint, by id, and the feed's highest position, in one statement. On
    PostgreSQL the endpoints' rows are locked in id order to the commit (two passes cannot
    deadlock); on SQLite the caller holds the write lock already."""
    rows = (await session.execute(_targets(is_sqlite))).all()
    targets = [
        Target(
            endpoint_id=str(row[0]),
            url=str(row[1]),
            event_types=tuple(json.loads(row[2])),
            ordering=str(row[3]),
            disabled=bool(row[4]),
            secret=str(row[5]),
            previous_secret=row[6],
            previous_until_ms=None if row[7] is None else int(row[7]),
            position=int(row[8]),
        )
        for row in rows
    ]
    return targets, int(rows[0][9] or 0) if rows else 0


# The statements of a pass are built once (per dialect kind, per shape): a pass runs on
# the loop that serves requests, and building one anew cost about as much of its CPU as
# running it.


@functools.lru_cache(maxsize=2)
def _targets(is_sqlite: bool) -> Select[Any]:
    """read_targets' statement."""
    top = select(func.coalesce(func.max(EventRow.position), 0)).scalar_subquery()
    table = EndpointRow
    query = select(
        table.endpoint_id,
        table.url,
        table.event_types,
        table.ordering,
        table.disabled,
        table.secret,
        table.previous_secret,
        table.previous_until_ms,
        table.position,
        top,
    ).order_by(table.endpoint_id)
    if not is_sqlite:
        query = query.with_for_update(of=table)
    return query


async def derive(database: Database, now_ms: int) -> int:
    """Queue a delivery for each event past each endpoint's position that it subscribes to
    (disabled endpoints too: they keep their queue), and move the positions; returns how
    many were queued. One transaction, which positions the feed first; safe in several
    processes at once (they take the endpoints' rows, or SQLite's write lock, in turn)."""
    async with database.transaction() as session:
        await sequence_in(session, database.is_sqlite)
        targets, top = await read_targets(session, database.is_sqlite)
        return await derive_in(session, targets, top, now_ms)


async def derive_in(session: AsyncSession, targets: list[Target], top: int, now_ms: int) -> int:
    """derive inside the caller's transaction, which holds the endpoints' rows as read
    (read_targets): endpoints at one position (the usual case: all caught up together)
    share one read of the feed, one position update serves them all, one insert every
    endpoint's deliveries."""
    behind = [t for t in targets if t.position < top]
    if not behind:
        return 0
    reads = {p: await _events_after(session, p) for p in sorted({t.position for t in behind})}
    rows: list[dict[str, Any]] = []
    moves: list[dict[str, Any]] = []
    for target in behind:
        events = reads[target.position]
        if not events:
            continue
        moves.append({"endpoint": target.endpoint_id, "old": target.position, "new": events[-1][0]})
        rows += [
            delivery_row(target.endpoint_id, int(p), kind, data, now_ms)
            for p, kind, data in events
            if subscribes(list(target.event_types), kind)
        ]
    if moves:
        await session.execute(_MOVE_POSITION, moves)
    await _INSERT_DELIVERIES.run(session, rows)
    return len(rows)


_ENDPOINTS = cast(Table, EndpointRow.__table__)
# An endpoint's position moved on, only from the value the pass read.
_MOVE_POSITION = (
    update(_ENDPOINTS)
    .where(
        _ENDPOINTS.c.endpoint_id == bindparam("endpoint"),
        _ENDPOINTS.c.position == bindparam("old"),
    )
    .values(position=bindparam("new"))
)


# Derived deliveries; one that exists already is left as it is.
_INSERT_DELIVERIES = ManyRows(
    lambda dialect: named_dialect_insert(dialect, DeliveryRow.__table__).on_conflict_do_nothing()
)


_EVENTS_AFTER = (
    select(EventRow.position, EventRow.type, EventRow.data)
    .where(EventRow.position > bindparam("after", type_=BigInteger))
    .order_by(EventRow.position)
    .limit(DERIVE_BATCH)
)


async def _events_after(session: AsyncSession, position: int) -> list[Any]:
    """Up to DERIVE_BATCH feed events after `position`: (position, type, data)."""
    return list((await session.execute(_EVENTS_AFTER, {"after": position})).all())


def _work_probe() -> Select[tuple[bool]]:
    """Whether a pass would find anything to do at `now` (a bound parameter), short of
    outcomes to record and claims to renew, which the process knows itself: an endpoint
    exists and either a feed event waits for its position, an endpoint is behind the feed,
    or an enabled endpoint has a delivery due and unclaimed. A read: it takes no lock."""
    now = bindparam("now", type_=BigInteger)
    top = select(func.max(EventRow.position)).scalar_subquery()
    unpositioned = select(EventRow.id).where(EventRow.position.is_(None)).exists()
    behind = select(EndpointRow.endpoint_id).where(EndpointRow.position < top).exists()
    # Per endpoint, so that its pending rows are found through ix_webhook_deliveries_due
    # rather than by a scan of every delivery ever made.
    due = (
        select(EndpointRow.endpoint_id)
        .where(
            EndpointRow.disabled.is_(False),
            select(DeliveryRow.id)
            .where(
                DeliveryRow.endpoint_id == EndpointRow.endpoint_id,
                DeliveryRow.status == "pending",
                DeliveryRow.next_ms <= now,
                or_(DeliveryRow.claim_until_ms.is_(None), DeliveryRow.claim_until_ms <= now),
            )
            .exists(),
        )
        .exists()
    )
    registered = select(EndpointRow.endpoint_id).exists()
    return select(and_(registered, or_(unpositioned, behind, due)))


# Built once: an idle process runs it at every poll.
_WORK_PROBE = _work_probe()


async def work_waits(session: AsyncSession, now_ms: int) -> bool:
    """Whether a pass at `now_ms` has feed events to position, deliveries to derive or
    deliveries to claim (_work_probe): one statement, no lock."""
    return bool(await session.scalar(_WORK_PROBE, {"now": now_ms}))


def _earlier_pending() -> Any:
    """For entity ordering: a pending delivery of the same endpoint and entity that comes
    before (lower version, or the same version and an earlier feed position)."""
    other = aliased(DeliveryRow)
    return (
        select(other.id)
        .where(
            other.endpoint_id == DeliveryRow.endpoint_id,
            other.entity == DeliveryRow.entity,
            other.status == "pending",
            or_(
                other.entity_version < DeliveryRow.entity_version,
                and_(
                    other.entity_version == DeliveryRow.entity_version,
                    other.event_position < DeliveryRow.event_position,
                ),
            ),
        )
        .exists()
    )


def new_owner() -> str:
    """A process's claim prefix: the first half of each claim token it takes."""
    return secrets.token_hex(OWNER_CHARS // 2)


async def claim(
    database: Database,
    endpoint_id: str,
    now_ms: int,
    limit: int,
    claim_ms: int,
    owner: str,
) -> list[Claimed]:
    """Claim one endpoint's due deliveries for the process `owner` (claim_in for one
    endpoint, in a transaction of its own)."""
    async with database.transaction() as session:
        await sequence_in(session, database.is_sqlite)
        targets, _ = await read_targets(session, database.is_sqlite)
        wanted = {t.endpoint_id: limit for t in targets if t.endpoint_id == endpoint_id}
        return await claim_in(session, targets, wanted, now_ms, claim_ms, new_token(owner))


def new_token(owner: str) -> str:
    """A claim token of the process `owner`: its prefix, then a random part."""
    return owner + secrets.token_hex(OWNER_CHARS // 2)


async def claim_in(
    session: AsyncSession,
    targets: list[Target],
    wanted: dict[str, int],
    now_ms: int,
    claim_ms: int,
    token: str,
) -> list[Claimed]:
    """Claim due deliveries under `token`, inside the caller's transaction, which holds the
    endpoints' rows (read_targets): for each enabled endpoint in `wanted`, up to its number
    claimed at once by this process, in feed order; with `ordering: "entity"` only the
    first pending delivery of each entity. None for an endpoint while another process
    holds claims on it (one process works an endpoint at a time, so its bound on attempts
    in flight holds for the endpoint). Three statements whatever the number of endpoints:
    the live claims counted, the due rows chosen (one branch per endpoint), the claim."""
    chosen = [t for t in targets if not t.disabled and wanted.get(t.endpoint_id, 0) > 0]
    if not chosen:
        return []
    live = await session.execute(
        _LIVE_CLAIMS,
        {
            "endpoints": [t.endpoint_id for t in chosen],
            "owner": token[:OWNER_CHARS],
            "now": now_ms,
        },
    )
    held: dict[str, int] = {}
    busy: set[str] = set()
    for endpoint_id, is_mine, count in live.all():
        if is_mine:
            held[str(endpoint_id)] = int(count)
        elif count:
            busy.add(str(endpoint_id))
    picks: list[tuple[Target, int]] = []
    for target in chosen:
        room = wanted[target.endpoint_id] - held.get(target.endpoint_id, 0)
        if target.endpoint_id not in busy and room > 0:
            picks.append((target, room))
    if not picks:
        return []
    values: dict[str, Any] = {"now": now_ms}
    for index, (target, room) in enumerate(picks):
        values[f"endpoint_{index}"] = target.endpoint_id
        values[f"room_{index}"] = room
    statement = _picking(tuple(target.ordering for target, _ in picks))
    found = (await session.execute(statement, values)).all()
    if not found:
        return []
    until = now_ms + claim_ms
    await _CLAIM.run(
        session, [{"delivery": row[0], "token": token, "until": until} for row in found]
    )
    bodies = Bodies()
    return [
        Claimed(
            delivery_id=int(delivery_id),
            token=token,
            endpoint_id=str(endpoint_id),
            position=int(position),
            event_type=kind,
            tries=int(tries),
            body=bodies.body(int(position), kind, at, data),
        )
        for delivery_id, endpoint_id, position, tries, kind, at, data in found
    ]


_CLAIM = ManyRows(
    lambda _: (
        update(DeliveryRow)
        .where(DeliveryRow.id == bindparam("delivery"))
        .values(claim_token=bindparam("token"), claim_until_ms=bindparam("until"))
    )
)


_OWNED = func.substr(DeliveryRow.claim_token, 1, OWNER_CHARS) == bindparam("owner")
# The live claims on the endpoints `endpoints`, counted apart for the process `owner`.
_LIVE_CLAIMS = (
    select(DeliveryRow.endpoint_id, _OWNED, func.count())
    .where(
        DeliveryRow.endpoint_id.in_(bindparam("endpoints", expanding=True)),
        DeliveryRow.status == "pending",
        DeliveryRow.claim_until_ms > bindparam("now", type_=BigInteger),
    )
    .group_by(DeliveryRow.endpoint_id, _OWNED)
)


@functools.lru_cache(maxsize=64)
def _picking(orderings: tuple[str, ...]) -> Select[int, str, int, int, str, datetime, str]:
    """The due deliveries of as many endpoints as `orderings` has, with what their bodies
    are made of: for the i-th, the endpoint `endpoint_<i>`, at most `room_<i>` of its
    deliveries (one branch of a UNION ALL each), due at `now`."""
    now = bindparam("now", type_=BigInteger)
    branches = [_due(index, ordering, now) for index, ordering in enumerate(orderings)]
    picked = (
        branches[0]
        if len(branches) == 1
        else union_all(*(select(branch.subquery().c.id) for branch in branches))
    ).subquery()
    return (
        select(
            DeliveryRow.id,
            DeliveryRow.endpoint_id,
            DeliveryRow.event_position,
            DeliveryRow.tries,
            EventRow.type,
            EventRow.at,
            EventRow.data,
        )
        .join(picked, picked.c.id == DeliveryRow.id)
        .join(EventRow, EventRow.position == DeliveryRow.event_position)
        .order_by(DeliveryRow.endpoint_id, DeliveryRow.event_position)
    )


def _due(index: int, ordering: str, now: BindParameter[int]) -> Select[int]:
    """The deliveries of the endpoint `endpoint_<index>` an attempt may start now, in feed
    order, at most `room_<index>` of them."""
    due = select(DeliveryRow.id).where(
        DeliveryRow.endpoint_id == bindparam(f"endpoint_{index}"),
        DeliveryRow.status == "pending",
        DeliveryRow.next_ms <= now,
        or_(DeliveryRow.claim_until_ms.is_(None), DeliveryRow.claim_until_ms <= now),
    )
    if ordering == "entity":
        due = due.where(or_(DeliveryRow.entity == "", ~_earlier_pending()))
    return due.order_by(DeliveryRow.event_position).limit(bindparam(f"room_{index}"))


_RENEW = ManyRows(
    lambda _: (
        update(DeliveryRow)
        .where(
            DeliveryRow.id == bindparam("delivery"),
            DeliveryRow.claim_token == bindparam("token"),
            DeliveryRow.status == "pending",
        )
        .values(claim_until_ms=bindparam("until"))
    )
)


async def renew_in(session: AsyncSession, claims: list[Claimed], until_ms: int) -> None:
    """renew inside the caller's transaction."""
    rows = [{"delivery": c.delivery_id, "token": c.token, "until": until_ms} for c in claims]
    await _RENEW.run(session, rows)


async def renew(database: Database, claims: list[Claimed], until_ms: int) -> None:
    """Extend claims this process still holds (attempts running, waiting for a worker or
    for their outcome's record) to `until_ms`; a claim already ended or taken over is left
    as it is."""
    async with database.transaction() as session:
        await renew_in(session, claims, until_ms)


async def release(database: Database, claims: list[Claimed]) -> None:
    """Give claims back unattempted (the process is stopping): due again at once, for any
    process."""
    async with database.transaction() as session:
        await release_in(session, claims)


async def release_in(session: AsyncSession, claims: list[Claimed]) -> None:
    """release inside the caller's transaction."""
    rows = [{"delivery": c.delivery_id, "token": c.token} for c in claims]
    await _RELEASE.run(session, rows)


_RELEASE = ManyRows(
    lambda _: (
        update(DeliveryRow)
        .where(
            DeliveryRow.id == bindparam("delivery"), DeliveryRow.claim_token == bindparam("token")
        )
        .values(claim_token=None, claim_until_ms=None)
    )
)
