"""An activity as SQL records it, and the copy of its parameters Redis keeps for the scripts."""

from __future__ import annotations

from groupbuy_client.wire import to_ms

from groupbuy import errors
from groupbuy.locks.counts import ACTIVITY_COPY_TTL_MS, ActivityCounts
from groupbuy.locks.models import ActivityRow
from groupbuy.storage.backends import Backends, UsesBackends


class ActivityCopy(UsesBackends):
    """Reads an activity's SQL row and writes Redis's expiring copy of it (and its counts,
    from SQL, when Redis has none)."""

    def __init__(self, backends: Backends, counts: ActivityCounts) -> None:
        super().__init__(backends)
        self.counts = counts

    async def row(self, activity_id: str) -> ActivityRow:
        """The activity's SQL row, or ActivityNotFound."""
        async with self._db.sessions() as session:
            row = await session.get(ActivityRow, activity_id)
        if row is None:
            raise errors.ActivityNotFound(f"no activity {activity_id!r}")
        return row

    async def put(self, row: ActivityRow) -> None:
        """Write what the scripts need of an activity to Redis (its parameters, and its status
        once closed); rewriting it is harmless."""
        # A copy of SQL's row that expires: an open that misses it puts it back from SQL.
        # Its slot is in the directory first (Redis Cluster), with its copy of the blocked
        # users, before any team of it can be written there.
        await self._slots.join(self._keys.activity_slot(row.activity_id))
        key = self._keys.activity(row.activity_id)
        async with self._redis.pipeline(transaction=False) as pipe:
            pipe.hset(key, mapping=copy_fields(row))
            if row.status == "closed":
                # Only ever written as closed: a copy put from an older read of an open row
                # (a recovery racing a close) then never reopens the activity.
                pipe.hset(key, "status", "closed")
            pipe.pexpire(key, ACTIVITY_COPY_TTL_MS)
            # Counts that expire (no team lived since they were put) last as long as the
            # copy: a team opened after they went would count from nothing. Counts a live
            # team keeps have no expiry, and get none (XX).
            counts = self._keys.activity_counts(row.activity_id)
            pipe.pexpire(counts, ACTIVITY_COPY_TTL_MS, xx=True)
            pipe.hexists(counts, "counted")
            counted = (await pipe.execute())[-1]
        if not counted:
            # A new activity, or the first put after a loss: before any team is put back.
            await self.counts.put_from_sql(row.activity_id)


def copy_fields(row: ActivityRow) -> dict[str, int | str]:
    """The fields of the activity's Redis copy (written in one HSET: a script never sees a
    copy without its sale). The sale's are absent when not set: `starts_ms`, `ends_ms`
    (no schedule), `stock` (no cap), `late_confirm` ('1' when set); `max_hold_ms` always."""
    fields: dict[str, int | str] = {
        "team_size": row.team_size,
        "lock_ttl_ms": row.lock_ttl_s * 1000,
        "team_deadline_ms": row.team_deadline_s * 1000,
        "virtual_min": row.virtual_min_members or 0,
        "teams_per_user": row.teams_per_user or 0,
        "open_per_leader": row.open_teams_per_leader or 0,
        "max_hold_ms": row.max_hold_s * 1000,
    }
    if row.starts_at is not None:
        fields["starts_ms"] = to_ms(row.starts_at)
    if row.ends_at is not None:
        fields["ends_ms"] = to_ms(row.ends_at)
    if row.stock is not None:
        fields["stock"] = row.stock
    if row.late_confirm:
        fields["late_confirm"] = "1"
    waitlist = row.waitlist
    fields["waitlist_max"] = waitlist["max_len"]
    fields["waitlist_ttl_ms"] = waitlist["ttl_s"] * 1000
    fields["offer_ttl_ms"] = waitlist["offer_ttl_s"] * 1000
    return fields
