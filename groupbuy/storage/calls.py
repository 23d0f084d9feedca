"""Typed wrappers of the storage-level scripts (leases, outboxes, write probe); the
throttles' scripts sit with their throttles (groupbuy/storage/throttles.py).

Each spec names its script's KEYS, ARGV and reply (docs/scripts.md is rendered from
them); each wrapper takes named keys and arguments and answers its reply read by the spec.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from groupbuy.storage.specs import (
    Fixed,
    ScriptCaller,
    ScriptSpec,
    Slot,
    Verdict,
    shape,
    slots,
)


def _entries(raw: Sequence[Sequence[Any]]) -> list[tuple[str, list[Any]]]:
    """outbox_read's entries: (id, flat fields) each."""
    return [(entry_id, fields) for entry_id, fields in raw]


_STREAM = ("stream", "the outbox stream (an activity's or a packet's)")
_PENDING = ("pending", "the pending index: zset member -> ms of the stream's oldest entry")

LEASE_HOLD: ScriptSpec[Verdict] = ScriptSpec(
    "lease_hold",
    "Take a free lease, or extend the one this holder already has.",
    keys=slots(("lease", "the lease key (value: the holder's token)")),
    args=slots(("token", "the holder's token"), ("ttl_ms", "how long the lease lasts")),
    replies={
        Verdict.YES: shape("held (taken or extended)"),
        Verdict.NO: shape("another holder has it"),
    },
)
LEASE_RELEASE: ScriptSpec[Verdict] = ScriptSpec(
    "lease_release",
    "Give a lease back, only if this holder still has it.",
    keys=slots(("lease", "the lease key")),
    args=slots(("token", "the holder's token")),
    replies={
        Verdict.YES: shape("released"),
        Verdict.NO: shape("it was not ours (expired, or taken by another)"),
    },
)
OUTBOX_ACK: ScriptSpec[Fixed] = ScriptSpec(
    "outbox_ack",
    "Forget outbox entries SQL recorded; keep the stream's pending-index entry true.",
    keys=slots(_STREAM, _PENDING),
    args=slots(
        ("group", "consumer group that read the entries, or '' when read without one"),
        ("drop_empty", "'1': delete the stream once empty (no record can follow), '0': keep it"),
        ("member", "the stream's member in the pending index (activity_id or packet_id)"),
    ),
    more_args=Slot("ids", "entry ids; none only re-indexes the stream"),
    reply=shape("entries deleted, entries left", ("done", int), ("left", int)),
)
OUTBOX_BURY: ScriptSpec[Fixed] = ScriptSpec(
    "outbox_bury",
    "Move poison outbox entries to the dead-letter stream, then forget them as outbox_ack.",
    keys=slots(
        _STREAM,
        _PENDING,
        ("dead_letters", "dead-letter stream, capped (the one of the outbox's slot in a cluster)"),
    ),
    args=slots(
        ("group", "consumer group that read the entries, or '' when read without one"),
        ("member", "the stream's member in the pending index (activity_id or packet_id)"),
        ("kind", "the outbox's kind: packets or teams"),
        ("cap", "approximate cap of the dead-letter stream"),
    ),
    more_args=Slot("entries", "pairs: entry id, dead_letters row id in SQL"),
    reply=shape(
        "entries buried (0 for one already gone), entries left in the outbox",
        ("done", int),
        ("left", int),
    ),
)
OUTBOX_READ: ScriptSpec[Fixed] = ScriptSpec(
    "outbox_read",
    "The entries of an outbox stream from one id to another, for the write-behind.",
    keys=slots(_STREAM),
    args=slots(
        ("first", "first id ('-': from the start)"),
        ("last", "last id ('+': to the end)"),
        ("most", "most entries"),
        ("publish", "'1': publish, so a WAIT covers what the server held; '0': not"),
    ),
    reply=shape(
        "entries read, then each entry: {id, {field, value, ...}}",
        ("count", int),
        ("entries", _entries),
    ),
)
WRITE_PROBE: ScriptSpec[Verdict] = ScriptSpec(
    "write_probe",
    "Change nothing; fail with OOM when Redis refuses writes now.",
    keys=slots(("route_key", "a key of the slot the next write goes to (not read)")),
    args=(),
    replies={Verdict.NO: shape("nothing changed: Redis takes writes")},
)
CONTRACTS: tuple[ScriptSpec[Any], ...] = (
    LEASE_HOLD,
    LEASE_RELEASE,
    OUTBOX_ACK,
    OUTBOX_BURY,
    OUTBOX_READ,
    WRITE_PROBE,
)


@dataclass(frozen=True)
class OutboxLeft:
    """What an outbox_ack or outbox_bury did: entries deleted (or buried), entries left."""

    done: int
    left: int


async def lease_hold(scripts: ScriptCaller, lease: str, token: str, ttl_ms: int) -> bool:
    """Take or extend a lease; whether this holder has it."""
    reply = await LEASE_HOLD.run(
        scripts, LEASE_HOLD.key_list(lease=lease), {"token": token, "ttl_ms": ttl_ms}
    )
    return reply.code is Verdict.YES


async def lease_release(scripts: ScriptCaller, lease: str, token: str) -> bool:
    """Give a lease back; whether it was ours."""
    reply = await LEASE_RELEASE.run(scripts, LEASE_RELEASE.key_list(lease=lease), {"token": token})
    return reply.code is Verdict.YES


async def outbox_ack(
    scripts: ScriptCaller,
    stream: str,
    pending: str,
    *,
    group: str,
    drop_empty: bool,
    member: str,
    ids: Sequence[str],
) -> OutboxLeft:
    """Acknowledge and delete recorded entries, and re-index the stream."""
    reply = await OUTBOX_ACK.run(
        scripts,
        OUTBOX_ACK.key_list(stream=stream, pending=pending),
        {"group": group, "drop_empty": "1" if drop_empty else "0", "member": member},
        ids,
    )
    return OutboxLeft(reply.done, reply.left)


async def outbox_bury(
    scripts: ScriptCaller,
    stream: str,
    pending: str,
    dead_letters: str,
    *,
    group: str,
    member: str,
    kind: str,
    cap: int,
    entries: Sequence[tuple[str, str]],
) -> OutboxLeft:
    """Move entries to the dead letters and out of their outbox."""
    flat = [part for pair in entries for part in pair]
    reply = await OUTBOX_BURY.run(
        scripts,
        OUTBOX_BURY.key_list(stream=stream, pending=pending, dead_letters=dead_letters),
        {"group": group, "member": member, "kind": kind, "cap": str(cap)},
        flat,
    )
    return OutboxLeft(reply.done, reply.left)


async def outbox_read(
    scripts: ScriptCaller, stream: str, *, first: str, last: str, most: int, publish: bool
) -> list[tuple[str, list[Any]]]:
    """The entries (id, flat fields) of a stream between two ids."""
    reply = await OUTBOX_READ.run(
        scripts,
        OUTBOX_READ.key_list(stream=stream),
        {"first": first, "last": last, "most": most, "publish": "1" if publish else "0"},
    )
    entries: list[tuple[str, list[Any]]] = reply.entries
    return entries


async def write_probe(scripts: ScriptCaller, route_key: str) -> None:
    """Raise OOM when Redis refuses writes in the slot of `route_key` now."""
    await WRITE_PROBE.run(scripts, WRITE_PROBE.key_list(route_key=route_key), {})
