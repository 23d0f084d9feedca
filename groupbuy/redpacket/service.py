"""RedPacketService: send, grab, read, expire and repair red packets (no HTTP in here).

Money moves in SQL; grabs are decided in Redis. A send debits the sender and records
the packet in one SQL transaction, then puts the packet and its pre-drawn shares in
Redis. A grab is one Lua script that also appends the grab to the packet's outbox
stream; the PacketRecordWriter turns those records into grab rows and ledger credits.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
from collections.abc import Sequence
from typing import Any, NoReturn, cast

import redis.exceptions
from sqlalchemy import CursorResult, delete, select, update
from sqlalchemy.ext.asyncio import AsyncSession

from groupbuy import errors
from groupbuy.metrics import GRAB_OUTCOMES, RESTORED, counts_outcomes, grab_outcome
from groupbuy.outcome import Outcome
from groupbuy.redpacket import ledger
from groupbuy.redpacket.acks import AckJournal
from groupbuy.redpacket.codec import (
    PacketRefunded,
    deposit_key,
    grab_value,
    packet_debit_key,
    packet_event_key,
)
from groupbuy.redpacket.codes import PacketCode, raise_for
from groupbuy.redpacket.models import GrabRow, PacketEpochRow, PacketRow
from groupbuy.redpacket.records import apply_packet_records
from groupbuy.redpacket.scripts import PacketScripts
from groupbuy.redpacket.split import split
from groupbuy.redpacket.view import PacketView, packet_version
from groupbuy.redpacket.writer import CALLS_AT_ONCE, PacketRecordWriter
from groupbuy.settings import RedPacketSettings
from groupbuy.storage.backends import Backends, UsesBackends
from groupbuy.storage.db import insert_ignore
from groupbuy.storage.events import Event, EventRow, record_event
from groupbuy.storage.restore import rebuilding
from groupbuy.storage.scripts import reply_dict
from groupbuy.storage.slots import due_in
from groupbuy.storage.timefmt import from_ms, iso_ms, to_ms

log = logging.getLogger(__name__)

# The repair job's re-index page: SQL rows per run.
REINDEX_PAGE = 5000
# A UTC day in ms, and how long a sender's day counters outlive their day (a send that read
# the clock just before midnight still finds them).
DAY_MS = 86_400_000
DAY_KEY_SLACK_MS = 3_600_000
# A grab request's token: 9 random bytes, 12 URL-safe characters stored with each grab.
GRAB_TOKEN_BYTES = 9


def _refuse(code: PacketCode, packet_id: str) -> NoReturn:
    raise_for(code, f"packet {packet_id!r} is {code.name.lower().replace('_', ' ')}")


async def _recorded_grabs(session: AsyncSession, packet_id: str) -> Sequence[GrabRow]:
    """A packet's grab rows in seq order."""
    query = select(GrabRow).where(GrabRow.packet_id == packet_id).order_by(GrabRow.seq)
    return (await session.scalars(query)).all()


class RedPacketService(UsesBackends):
    """Red packets and the accounts they move money between."""

    def __init__(
        self,
        backends: Backends,
        limits: RedPacketSettings,
        writer: PacketRecordWriter,
        acks: AckJournal,
        resend_window_ms: int = 60_000,
    ) -> None:
        super().__init__(backends)
        self._limits = limits
        self._resend_window_ms = resend_window_ms
        self.writer = writer
        self.acks = acks
        self._packets = PacketScripts(backends.scripts, backends.keys, backends.clock)
        self._reindex_after = ""  # where the repair job's next re-index page starts

    async def _expire(self, packet_id: str) -> tuple[PacketCode, list[Any]]:
        reply = await self._packets.expire(packet_id)
        return reply.code, reply.rest

    # -- accounts -------------------------------------------------------------------

    async def deposit(self, user_id: str, amount_cents: int, reference: str) -> Outcome:
        """Credit a user once per reference; the same reference again returns the balance."""
        at = from_ms(await self._clock.now_ms(self._redis))
        async with self._db.transaction() as session:
            applied = await ledger.post_entry(
                session,
                user_id=user_id,
                kind="deposit",
                amount_cents=amount_cents,
                business_key=deposit_key(reference),
                at=at,
            )
            if not applied:
                earlier = await ledger.entry(session, deposit_key(reference))
                assert earlier is not None
                if (earlier.user_id, earlier.amount_cents) != (user_id, amount_cents):
                    raise errors.Conflict(
                        f"reference {reference!r} was used for another deposit", reference=reference
                    )
            balance = await ledger.balance(session, user_id)
        return Outcome({"user_id": user_id, "balance_cents": balance}, applied)

    async def account(self, user_id: str) -> dict[str, Any]:
        """A user's balance (0 for an unknown user)."""
        async with self._db.sessions() as session:
            return {"user_id": user_id, "balance_cents": await ledger.balance(session, user_id)}

    # -- send -----------------------------------------------------------------------

    async def send(
        self,
        sender_id: str,
        amount_cents: int,
        count: int,
        packet_id: str | None = None,
        expires_in_s: int | None = None,
        strategy: str = "double_mean",
    ) -> Outcome:
        """Debit the sender and create the packet; the same packet_id again returns it.

        A blocked sender (403) and a send past the sender's daily caps (409) are refused by
        the admission script before any money moves."""
        limits = self._limits
        if count > limits.max_count:
            raise errors.InvalidRequest(f"count may be at most {limits.max_count}")
        if amount_cents > limits.max_amount_cents:
            raise errors.InvalidRequest(f"amount_cents may be at most {limits.max_amount_cents}")
        if amount_cents < count:
            raise errors.InvalidRequest("amount_cents must be at least count (1 cent per share)")
        packet_id = packet_id or f"p{secrets.token_hex(8)}"
        expires_in_s = expires_in_s or limits.expires_in_s
        now_ms = await self._clock.now_ms(self._redis)
        wanted = {
            "sender_id": sender_id,
            "amount_cents": amount_cents,
            "count": count,
            "strategy": strategy,
            "expires_in_s": expires_in_s,
        }
        # The sender's and the packet's slots are in the directory (Redis Cluster), each with
        # its copy of the blocked users, before the admission reads one and the packet is
        # written to the other.
        await self._slots.join(self._keys.sender_slot(sender_id), self._keys.packet_slot(packet_id))
        # The admission is a write script: over maxmemory Redis refuses it up front, so a
        # send Redis could not take is refused before the debit.
        counted = await self._admit(sender_id, packet_id, amount_cents, now_ms)
        try:
            created, row = await self._record_send(packet_id, wanted, now_ms)
        except Exception:
            if counted:  # refused (too little money) or failed: the send did not happen
                await self._unadmit(sender_id, packet_id, now_ms)
            raise
        if counted and not created:  # a repeat: the first send was counted on its own day
            await self._unadmit(sender_id, packet_id, now_ms)
        if not created and any(getattr(row, k) != v for k, v in wanted.items()):
            raise errors.Conflict(f"packet {packet_id!r} exists with other parameters")
        if row.status == "pending":
            try:
                await self._make_live(row, joined=True)
            except redis.exceptions.OutOfMemoryError:
                # Memory ran out between the admission and the packet: the client is told nothing
                # was applied, so the debit and the packet's record go (a repeat starts over).
                if created:
                    await self._unsend(row)
                    if counted:
                        await self._unadmit(sender_id, packet_id, now_ms)
                raise
        return Outcome(self._sent_body(row), created)

    async def _admit(self, sender_id: str, packet_id: str, amount_cents: int, now_ms: int) -> bool:
        """The send's first step, in Redis before any money moves: a blocked sender is refused
        (403) and the sender's daily caps are checked and counted atomically (409); True when
        this call counted the send (take it back if the send then does not happen)."""
        limits, day = self._limits, now_ms // DAY_MS
        admitted = await self._packets.admit(
            self._keys.blocked_users(self._keys.sender_slot(sender_id)),
            self._keys.sender_day(sender_id, day),
            sender_id=sender_id,
            packet_id=packet_id,
            amount_cents=amount_cents,
            daily_count_cap=limits.sender_daily_count,
            daily_amount_cap=limits.sender_daily_amount_cents,
            day_expire_at_ms=(day + 1) * DAY_MS + DAY_KEY_SLACK_MS,
            # A resent call (the reply was lost) finds its own count: still "counted by this
            # send", so a send that then fails in SQL still takes it back.
            request_token=secrets.token_urlsafe(GRAB_TOKEN_BYTES),
        )
        code, rest = admitted.code, admitted.rest
        if code is PacketCode.OK:
            return bool(int(rest[0]))
        if code is PacketCode.USER_BLOCKED:
            raise errors.UserBlocked(f"sender {sender_id!r} is blocked", user_id=sender_id)
        if code is PacketCode.LIMIT_EXCEEDED:
            async with self._db.sessions() as session:
                if await session.get(PacketRow, packet_id) is not None:
                    return False  # a repeat of a send counted on an earlier day: answer it
            limit, current, cap = str(rest[0]), int(rest[1]), int(rest[2])
            raise_for(
                code,
                f"sender {sender_id!r} has sent {current} of the {limit} cap ({cap}) today (UTC)",
                limit=limit,
                current=current,
                cap=cap,
            )
        raise RuntimeError(f"packet_admit answered {code!r}")

    async def _unadmit(self, sender_id: str, packet_id: str, now_ms: int) -> None:
        """Take back what _admit counted for a send that did not happen."""
        key = self._keys.sender_day(sender_id, now_ms // DAY_MS)
        await self._packets.unadmit(key, packet_id)

    async def _record_send(
        self, packet_id: str, wanted: dict[str, Any], now_ms: int
    ) -> tuple[bool, PacketRow]:
        """Record the packet and debit its sender in one SQL transaction: (created, the row);
        created is False when the packet id was recorded before (nothing changed)."""
        sender_id, amount_cents = wanted["sender_id"], wanted["amount_cents"]
        expires_in_s = wanted["expires_in_s"]
        async with self._db.transaction() as session:
            created = await insert_ignore(
                session,
                PacketRow.__table__,
                {
                    "packet_id": packet_id,
                    **wanted,
                    "status": "pending",
                    "refunded_cents": 0,
                    "records_done": False,
                    "created_at": from_ms(now_ms),
                    "expires_at": from_ms(now_ms + expires_in_s * 1000),
                },
            )
            if created:
                await ledger.post_entry(
                    session,
                    user_id=sender_id,
                    kind="packet_debit",
                    amount_cents=-amount_cents,
                    business_key=packet_debit_key(packet_id),
                    at=from_ms(now_ms),
                    require_funds=True,
                )
                await record_event(
                    session,
                    Event(
                        "packet.sent",
                        now_ms,
                        packet_event_key("packet.sent", packet_id),
                        {"packet_id": packet_id, **wanted, "version": 1},
                    ),
                )
            row = await session.get(PacketRow, packet_id, populate_existing=True)
        assert row is not None
        return created, row

    async def _unsend(self, row: PacketRow) -> None:
        """Take back a send whose packet Redis refused: its row, debit and event, in one
        transaction, unless the repair job has made it live meanwhile."""
        async with self._db.transaction() as session:
            gone = await session.execute(
                delete(PacketRow).where(
                    PacketRow.packet_id == row.packet_id, PacketRow.status == "pending"
                )
            )
            if cast(CursorResult[Any], gone).rowcount != 1:
                return
            await ledger.take_back(session, packet_debit_key(row.packet_id))
            await session.execute(
                delete(EventRow).where(
                    EventRow.dedup_key == packet_event_key("packet.sent", row.packet_id)
                )
            )
        log.warning("send of packet %s taken back: Redis refused the packet", row.packet_id)

    async def _make_live(self, row: PacketRow, joined: bool = False) -> None:
        """Create the Redis state of a recorded packet (idempotent), then mark it active;
        its slot joins the directory first unless the caller has `joined` it."""
        if not joined:
            await self._slots.join(self._keys.packet_slot(row.packet_id))
        shares = split(row.strategy, row.amount_cents, row.count)
        await self._packets.create(row.packet_id, shares, **self._recorded_args(row))
        async with self._db.transaction() as session:
            await session.execute(
                update(PacketRow)
                .where(PacketRow.packet_id == row.packet_id, PacketRow.status == "pending")
                .values(status="active")
            )
        row.status = "active"

    def _recorded_args(self, row: PacketRow) -> dict[str, Any]:
        """What packet_create and packet_restore write of the packet, as SQL records it."""
        return {
            "sender_id": row.sender_id,
            "amount_cents": row.amount_cents,
            "count": row.count,
            "strategy": row.strategy,
            "created_ms": to_ms(row.created_at),
            "expires_ms": to_ms(row.expires_at),
            "retention_ms": self._limits.retention_s * 1000,
        }

    async def repair_pending(self) -> dict[str, int]:
        """Finish sends whose Redis step failed: create the packet, or refund it if already over."""
        async with self._db.sessions() as session:
            pending = (
                await session.scalars(select(PacketRow).where(PacketRow.status == "pending"))
            ).all()
        now_ms = await self._clock.now_ms(self._redis)
        made_live = refunded = 0
        for row in pending:
            in_redis = await self._redis.exists(self._keys.packet_keys(row.packet_id).hash)
            if in_redis or to_ms(row.expires_at) > now_ms:
                await self._make_live(row)
                made_live += 1
            else:
                await self._refund_unsent(row)
                refunded += 1
        return {"pending": len(pending), "made_live": made_live, "refunded": refunded}

    async def _refund_unsent(self, row: PacketRow) -> None:
        # Its time ran out before it ever reached Redis: nobody grabbed, all goes back.
        # The same record a packet_expire script would have written, applied the same way
        # (its ledger and event keys make a second application, from any path, a no-op).
        refund: PacketRefunded = {
            "type": "packet.refunded",
            "at_ms": str(to_ms(row.expires_at)),
            "packet_id": row.packet_id,
            "sender_id": row.sender_id,
            "refunded_cents": str(row.amount_cents),
            "remaining_count": str(row.count),
        }
        async with self._db.transaction() as session:
            await apply_packet_records(session, [refund])
            await session.execute(
                update(PacketRow)
                .where(PacketRow.packet_id == row.packet_id)
                .values(records_done=True)  # there is no stream to drain
            )

    @staticmethod
    def _sent_body(row: PacketRow) -> dict[str, Any]:
        return {
            "packet_id": row.packet_id,
            "sender_id": row.sender_id,
            "amount_cents": row.amount_cents,
            "count": row.count,
            "strategy": row.strategy,
            "status": "active" if row.status == "pending" else row.status,
            "expires_at": iso_ms(to_ms(row.expires_at)),
        }

    # -- grab -----------------------------------------------------------------------

    @counts_outcomes(GRAB_OUTCOMES, grab_outcome)
    async def grab(self, packet_id: str, user_id: str) -> dict[str, Any]:
        """Take one share for the user; a repeat answers `already_grabbed` with the same amount.

        Each request carries a fresh token into the script, stored with the grab: when the
        Redis client resends the call after a timeout and the first run did happen, the
        resend finds its own token and answers `grabbed` as the first run did.
        """
        token = secrets.token_urlsafe(GRAB_TOKEN_BYTES)
        grab = (packet_id, user_id, token, self._resend_window_ms)
        grabbed = await self._packets.grab(*grab)
        code, rest = grabbed.code, grabbed.rest
        if code is PacketCode.NOT_FOUND:
            row = await self._recorded(packet_id)
            if not await self._bring_back(row):
                return await self._grab_from_record(row, user_id)
            grabbed = await self._packets.grab(*grab)
            code, rest = grabbed.code, grabbed.rest
            if code is PacketCode.NOT_FOUND:
                raise errors.RedisUnavailable(f"packet {packet_id!r} is missing from Redis")
        if code is PacketCode.OK:
            amount, left, seq, epoch, at_ms = (int(v) for v in rest)
            self.acks.note(packet_id, user_id, epoch, seq, amount, at_ms)
            return {"status": "grabbed", "amount_cents": amount, "remaining_count": left}
        if code is PacketCode.ALREADY_GRABBED:
            return {"status": "already_grabbed", "amount_cents": int(rest[0])}
        if code is PacketCode.USER_BLOCKED:
            raise errors.UserBlocked(f"user {user_id!r} is blocked", user_id=user_id)
        _refuse(code, packet_id)

    async def _bring_back(self, row: PacketRow) -> bool:
        """Put a packet Redis does not hold back in Redis when SQL says it should be live:
        a send whose Redis step has not happened yet, or an active packet Redis lost.
        False when its SQL record is the answer (it has ended)."""
        if row.status == "pending":
            await self._make_live(row)
            return True
        if row.status == "active":
            await self.restore(row.packet_id)
            return True
        return False

    async def restore(self, packet_id: str) -> bool:
        """Rebuild an active packet that Redis lost, from SQL; True if this call rebuilt it.

        Its recorded grabs go back (nobody grabs twice, earlier grabs answer the same
        amounts) and what remains is drawn again into count - grabs shares. The packet's
        epoch is raised in SQL first, under the packet row's lock, so records Redis wrote
        before it lost the packet (still on their way to SQL) are fenced out and reported,
        never applied on top of the new shares.
        """
        keys = self._keys
        async with rebuilding(
            self._redis, keys.packet_restoring(packet_id), keys.packet_keys(packet_id).hash
        ) as needed:
            if not needed:
                return False
            now_ms = await self._clock.now_ms(self._redis)
            async with self._db.transaction() as session:
                row = await session.scalar(
                    select(PacketRow).where(PacketRow.packet_id == packet_id).with_for_update()
                )
                if row is None or row.status != "active":
                    return False
                grabs = await _recorded_grabs(session, packet_id)
                mark = await session.get(PacketEpochRow, packet_id)
                epoch = (mark.epoch if mark else 0) + 1
                if mark is None:
                    session.add(
                        PacketEpochRow(
                            packet_id=packet_id,
                            epoch=epoch,
                            rebuilt_at=from_ms(now_ms),
                            grabs_kept=len(grabs),
                        )
                    )
                else:
                    mark.epoch, mark.rebuilt_at, mark.grabs_kept = (
                        epoch,
                        from_ms(now_ms),
                        len(grabs),
                    )
            left = row.count - len(grabs)
            left_cents = row.amount_cents - sum(g.amount_cents for g in grabs)
            shares = split(row.strategy, left_cents, left) if left else []
            recorded: list[Any] = []
            for g in grabs:
                recorded += [g.user_id, grab_value(g.seq, g.amount_cents, to_ms(g.grabbed_at))]
            await self._slots.join(keys.packet_slot(packet_id))
            restored = await self._packets.restore(
                packet_id,
                [*recorded, *shares],
                **self._recorded_args(row),
                epoch=epoch,
                seq_gap=max((g.seq for g in grabs), default=0) - len(grabs),
                version=packet_version(epoch, row.count, len(grabs), ended=False),
                grab_count=len(grabs),
            )
            code, rest = restored.code, restored.rest
        if code is not PacketCode.OK:
            return False
        RESTORED.labels("packet").inc()
        log.warning(
            "packet %s was missing from Redis: rebuilt from SQL (epoch %d, %d recorded grabs "
            "kept, %d cents drawn again into %d shares, %s)",
            packet_id,
            epoch,
            len(grabs),
            left_cents,
            left,
            rest[0],
        )
        return True

    async def _grab_from_record(self, row: PacketRow, user_id: str) -> dict[str, Any]:
        # Redis has let the ended packet go; its SQL record answers.
        async with self._db.sessions() as session:
            grab = await session.get(GrabRow, (row.packet_id, user_id))
        if grab is not None:
            return {"status": "already_grabbed", "amount_cents": grab.amount_cents}
        if row.status == "sold_out":
            _refuse(PacketCode.SOLD_OUT, row.packet_id)
        if row.status == "expired":
            _refuse(PacketCode.EXPIRED, row.packet_id)
        raise errors.RedisUnavailable(f"packet {row.packet_id!r} is missing from Redis")

    async def _recorded(self, packet_id: str) -> PacketRow:
        async with self._db.sessions() as session:
            row = await session.get(PacketRow, packet_id)
        if row is None:
            raise errors.PacketNotFound(f"no packet {packet_id!r}")
        return row

    # -- read -----------------------------------------------------------------------

    async def get(self, packet_id: str) -> dict[str, Any]:
        """A packet with its grabs: live from Redis, or from SQL once Redis let it go."""
        reading = await self._packets.read(packet_id)
        code, rest = reading.code, reading.rest
        if code is PacketCode.NOT_FOUND:
            row = await self._recorded(packet_id)
            if await self._bring_back(row):
                reading = await self._packets.read(packet_id)
                code, rest = reading.code, reading.rest
        if code is PacketCode.OK:
            packet, grabs, _now = rest
            return PacketView.from_redis(packet_id, reply_dict(packet), reply_dict(grabs)).body()
        row = await self._recorded(packet_id)
        async with self._db.sessions() as session:
            rows = await _recorded_grabs(session, packet_id)
            mark = await session.get(PacketEpochRow, packet_id)
        return PacketView.from_rows(row, rows, mark.epoch if mark else 0).body()

    # -- expiry ---------------------------------------------------------------------

    async def expire(self, packet_id: str) -> dict[str, Any]:
        """Close the packet if its time is up; its refund is recorded exactly once."""
        code, rest = await self._expire(packet_id)
        if code is PacketCode.OK:
            await self.writer.drain(packet_id)
            return {"packet_id": packet_id, "expired": True, "refunded_cents": int(rest[0])}
        if code in (PacketCode.NOT_DUE, PacketCode.EXISTING, PacketCode.NOT_FOUND):
            return {"packet_id": packet_id, "expired": False, "reason": code.name.lower()}
        raise RuntimeError(f"packet_expire answered {code!r}")

    async def expire_due(self, batch: int = 200, max_batches: int = 50) -> dict[str, int]:
        """Expire every active packet whose time is up (safe to repeat, from any process).

        The due index lists each active packet at its expiry (packet_create adds it, the
        script that ends the packet removes it), so a round reads only what is due; SQL's
        active packets are the repair job's to re-index (`reindex`).
        """
        now_ms = await self._clock.now_ms(self._redis)
        seen: set[str] = set()
        expired = 0
        slots = await self._slots.in_use()  # one due index per slot in Redis Cluster
        for _ in range(max_batches):
            listed = await due_in(
                self._redis, [self._keys.due_packets(slot) for slot in slots], now_ms, batch
            )
            more: list[int | None] = []
            for slot, due in zip(slots, listed, strict=True):
                fresh = [packet_id for packet_id in due if packet_id not in seen]
                for packet_id in fresh:
                    seen.add(packet_id)
                    expired += bool((await self.expire(packet_id))["expired"])
                if len(due) == batch and fresh:
                    more.append(slot)
            if not more:
                break
            slots = more
        return {"due": len(seen), "expired": expired}

    async def reindex(self, page: int = REINDEX_PAGE, restore_limit: int = 500) -> dict[str, int]:
        """Put back lost index entries for the next page of SQL's unfinished packets: the
        repair job's slow safety net (a full pass takes unfinished / page runs). A stream
        with records waiting goes back in the pending index; an active packet goes back in
        the due index (packet_expire re-indexes it, or expires it if its time is up), and
        one that Redis lost is rebuilt from SQL (at most `restore_limit` per run)."""
        async with self._db.sessions() as session:
            rows = (
                await session.execute(
                    select(PacketRow.packet_id, PacketRow.status)
                    .where(
                        PacketRow.records_done.is_(False),
                        PacketRow.status != "pending",
                        PacketRow.packet_id > self._reindex_after,
                    )
                    .order_by(PacketRow.packet_id)
                    .limit(page)
                )
            ).all()
        # A slot the directory lost (Redis lost data) is listed again, so the jobs read it.
        await self._slots.join(*(self._keys.packet_slot(packet_id) for packet_id, _ in rows))
        await self.writer.reindex([packet_id for packet_id, _status in rows])
        active = [packet_id for packet_id, status in rows if status == "active"]
        missing: list[str] = []
        for start in range(0, len(active), CALLS_AT_ONCE):
            chunk = active[start : start + CALLS_AT_ONCE]
            replies = await asyncio.gather(*(self._expire(packet_id) for packet_id in chunk))
            missing += [
                p
                for p, (code, _) in zip(chunk, replies, strict=True)
                if code is PacketCode.NOT_FOUND
            ]
        restored = 0
        for packet_id in missing[:restore_limit]:
            restored += await self.restore(packet_id)
        done = len(rows) < page or len(missing) <= restore_limit
        if done:
            self._reindex_after = rows[-1][0] if len(rows) == page else ""
        return {"packets_reindexed": len(rows), "packets_restored": restored}

    async def release_ended(self, limit: int = 1000) -> dict[str, int]:
        """Remove from Redis the ended packets whose every record is in SQL."""
        async with self._db.sessions() as session:
            ended = (
                await session.scalars(
                    select(PacketRow.packet_id)
                    .where(
                        PacketRow.status.in_(("sold_out", "expired")),
                        PacketRow.records_done.is_(True),
                        PacketRow.redis_cleared.is_(False),
                    )
                    .limit(limit)
                )
            ).all()
        for packet_id in ended:
            packet = self._keys.packet_keys(packet_id)
            await self._redis.delete(packet.hash, packet.shares, packet.grabs, packet.outbox)
        if ended:
            async with self._db.transaction() as session:
                await session.execute(
                    update(PacketRow)
                    .where(PacketRow.packet_id.in_(ended))
                    .values(redis_cleared=True)
                )
        return {"packets_released": len(ended)}
