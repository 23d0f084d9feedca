"""The write-behind's hot path: a batch of grab records as SQL rows, written as steps.

A flash grab fills its packet's outbox with grab records; each becomes a grab row, a
ledger credit and the credited user's balance. The rows are built from the records before
the transaction begins (`GrabRows`), so the transaction holds SQLite's single writer only
for the statements: one per table per batch, as the driver's own SQL
(groupbuy/storage/steps.py runs them; on a SQLite file in one hop to its writer thread).

Every statement keeps the records' idempotence: a grab row and a credit applied before
are skipped, and records of an epoch the packet has left are fenced out (`fence_steps`).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from groupbuy.redpacket.codec import grab_credit_key
from groupbuy.redpacket.ledger import Entry, entry_steps
from groupbuy.redpacket.records import GrabRecord, PacketRecord
from groupbuy.storage.bulk import Moments, placeholders
from groupbuy.storage.steps import Statement, Steps, inserting

log = logging.getLogger(__name__)

_NEW_GRABS = "INSERT INTO grabs (packet_id, user_id, seq, amount_cents, grabbed_at)"
_NEW_ACKNOWLEDGED = (
    "INSERT INTO acknowledged_grabs (packet_id, user_id, epoch, seq, amount_cents, acked_at, "
    "source)"
)
_ONCE = " ON CONFLICT DO NOTHING"
_RECORDED_ACK = "DELETE FROM acknowledged_grabs WHERE packet_id = ? AND user_id = ? AND epoch = ?"
_STATUS = "SELECT status FROM packets WHERE packet_id = ?"
# PostgreSQL keeps a prepared statement's generic plan once it costs no more than the
# custom ones: a plan made while the ledger was small (a sequential scan) then stays while
# a flash sale grows it, and the lookup of a batch's keys took 0.7 s instead of
# milliseconds. The batch's statements are planned for their values instead.
CUSTOM_PLANS = "SET LOCAL plan_cache_mode = force_custom_plan"


def record_epoch(f: PacketRecord) -> int:
    """The epoch of the Redis state that wrote a record (records before epochs: 0)."""
    return int(f.get("epoch", "0"))


@dataclass(frozen=True)
class GrabRows:
    """A batch's grab records with the rows they become: grab rows and ledger credits."""

    grabs: list[GrabRecord]
    rows: list[tuple[str, str, int, int, Any]]
    credits: list[Entry]

    @classmethod
    def of(cls, grabs: list[GrabRecord], moments: Moments) -> GrabRows:
        """Build the rows of `grabs` (outside any transaction)."""
        rows, credits = [], []
        for f in grabs:
            packet_id, user_id, at = f["packet_id"], f["user_id"], moments(f["at_ms"])
            amount = int(f["amount_cents"])
            rows.append((packet_id, user_id, int(f["seq"]), amount, at))
            credits.append(
                (grab_credit_key(packet_id, user_id), user_id, "grab_credit", amount, at)
            )
        return cls(grabs, rows, credits)


def fence_steps(
    records: Sequence[PacketRecord], postgresql: bool, moments: Moments
) -> Steps[list[PacketRecord]]:
    """The records of each packet's current epoch; the others are set aside, their grabs
    kept as acknowledged grabs for reconciliation to report.

    On PostgreSQL the packets' rows are share-locked first, so a rebuild (which locks its
    row for update before it raises the epoch and reads the grabs) waits for this batch to
    commit, and this batch waits for the rebuild: never both at once.
    """
    packet_ids = sorted({f["packet_id"] for f in records})
    share_lock = " FOR SHARE OF packets" if postgresql else ""
    rows = yield Statement(
        "SELECT packets.packet_id, packet_epochs.epoch FROM packets LEFT OUTER JOIN "
        "packet_epochs ON packet_epochs.packet_id = packets.packet_id WHERE "
        f"packets.packet_id IN ({placeholders(len(packet_ids))}){share_lock}",
        packet_ids,
    )
    epochs = {packet_id: epoch or 0 for packet_id, epoch in rows}
    current = [f for f in records if record_epoch(f) == epochs.get(f["packet_id"], 0)]
    if len(current) == len(records):
        return list(records)
    fenced = [f for f in records if record_epoch(f) != epochs.get(f["packet_id"], 0)]
    log.warning(
        "%d records of a rebuilt packet's lost epoch fenced out (grabs among them are "
        "reported by reconciliation)",
        len(fenced),
    )
    lost = [acknowledged_grab(f, "fenced", moments) for f in fenced if f["type"] == "grab"]
    yield from inserting(_NEW_ACKNOWLEDGED, lost, _ONCE)
    return current


def acknowledged_grab(f: GrabRecord, source: str, moments: Moments) -> tuple[Any, ...]:
    """The acknowledged_grabs row of a grab record (_NEW_ACKNOWLEDGED's values)."""
    return (
        f["packet_id"],
        f["user_id"],
        record_epoch(f),
        int(f["seq"]),
        int(f["amount_cents"]),
        moments(f["at_ms"]),
        source,
    )


def grab_steps(batch: GrabRows, postgresql: bool) -> Steps[None]:
    """The grab rows and their ledger credits, one statement per table, and the
    acknowledged-grab rows they make moot."""
    yield from inserting(_NEW_GRABS, batch.rows, _ONCE)
    yield from entry_steps(batch.credits, postgresql)
    # Recorded now: their acknowledgements have nothing left to prove (the journal row of
    # one that arrives later is dropped by reconciliation). Such rows are few, so they are
    # looked up, one statement per batch, and only those found are deleted.
    packet_ids = sorted({f["packet_id"] for f in batch.grabs})
    held = yield Statement(
        "SELECT packet_id, user_id, epoch FROM acknowledged_grabs WHERE packet_id IN "
        f"({placeholders(len(packet_ids))})",
        packet_ids,
    )
    if held:
        recorded = {(f["packet_id"], f["user_id"], record_epoch(f)) for f in batch.grabs}
        yield Statement(_RECORDED_ACK, sorted(set(held) & recorded), many=True)


def grab_batch_steps(
    packet_id: str, batch: GrabRows, postgresql: bool, moments: Moments
) -> Steps[str | None]:
    """One packet's batch of grab records, fenced and applied; returns the packet's status
    after it (None if SQL has no such packet)."""
    if postgresql:
        yield Statement(CUSTOM_PLANS)
    kept = yield from fence_steps(batch.grabs, postgresql, moments)
    if len(kept) < len(batch.grabs):
        current = {id(f) for f in kept}
        batch = GrabRows.of([f for f in batch.grabs if id(f) in current], moments)
    if batch.grabs:
        yield from grab_steps(batch, postgresql)
    status = yield Statement(_STATUS, (packet_id,))
    return str(status[0][0]) if status else None
