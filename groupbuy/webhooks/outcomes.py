"""What an ended attempt changes: the attempt row, the delivery's status and next try,
and the endpoint's state (disabled on a 410 or after `disable_after_s` of failures, with an
`endpoint.disabled` event in the feed)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, cast

from sqlalchemy import CursorResult, bindparam, insert, select, update
from sqlalchemy.ext.asyncio import AsyncSession

from groupbuy.storage.db import Database
from groupbuy.storage.events import Event, record_event
from groupbuy.storage.many import ManyRows
from groupbuy.webhooks.models import AttemptRow, DeliveryRow, EndpointRow
from groupbuy.webhooks.queue import Claimed
from groupbuy.webhooks.schedule import RETRY_AFTER_STATUSES, parse_retry_after, retry_wait_ms
from groupbuy.webhooks.sender import Reply

DISABLED_EVENT = "endpoint.disabled"


@dataclass(frozen=True)
class Completion:
    """What recording an attempt decided: the delivery's status, and whether the endpoint
    was disabled by it (and why)."""

    status: str
    disabled: str | None = None


@dataclass(frozen=True)
class Outcome:
    """One ended attempt to record: the claim it ran under, the reply, when it ended."""

    claimed: Claimed
    reply: Reply
    ended_ms: int


# The statements every pass runs over its batch, one row each (groupbuy/storage/many.py).
_INSERT_ATTEMPTS = ManyRows(lambda _: insert(AttemptRow))
# A delivery changes only under the claim its attempt ran with.
_UNDER_CLAIM = (
    DeliveryRow.id == bindparam("delivery"),
    DeliveryRow.claim_token == bindparam("token"),
)
_DELIVERED = ManyRows(
    lambda _: (
        update(DeliveryRow)
        .where(*_UNDER_CLAIM)
        .values(
            status="delivered",
            tries=DeliveryRow.tries + 1,
            claim_token=None,
            claim_until_ms=None,
            ended_ms=bindparam("ended"),
        )
    )
)
_ENDED = ManyRows(
    lambda _: (
        update(DeliveryRow)
        .where(*_UNDER_CLAIM)
        .values(
            status=bindparam("status"),
            tries=DeliveryRow.tries + bindparam("tried"),
            next_ms=bindparam("next"),
            claim_token=None,
            claim_until_ms=None,
            ended_ms=bindparam("ended"),
        )
    )
)


async def complete(
    database: Database, outcomes: list[Outcome], disable_after_ms: int, max_answer: int = 1024
) -> list[Completion]:
    """Record attempts, in one transaction, and what follows from each: delivered on a 2xx;
    on a 410 the endpoint is disabled and the delivery stays pending; otherwise the next try
    is scheduled (a Retry-After on 429/503 counted) or, past the schedule, the delivery has
    failed; an endpoint that has failed for `disable_after_ms` is disabled. An
    `endpoint.disabled` event enters the feed once per disabling. A delivery changes only
    under the claim the attempt ran with (a claim that expired and was taken over by
    another process leaves the delivery to that process; the attempt is still recorded)."""
    if not outcomes:
        return []
    async with database.transaction() as session:
        return await complete_in(session, outcomes, disable_after_ms, max_answer)


async def complete_in(
    session: AsyncSession, outcomes: list[Outcome], disable_after_ms: int, max_answer: int = 1024
) -> list[Completion]:
    """complete inside the caller's transaction."""
    if not outcomes:
        return []
    await _INSERT_ATTEMPTS.run(
        session,
        [
            {
                "delivery_id": o.claimed.delivery_id,
                "at_ms": o.ended_ms,
                "status_code": o.reply.status_code,
                "error": o.reply.error,
                "duration_ms": o.reply.duration_ms,
                "answer": _text(o.reply.answer[:max_answer]),
            }
            for o in outcomes
        ],
    )
    succeeded = [o for o in outcomes if o.reply.succeeded]
    if succeeded:
        # One round trip for the whole batch's successes.
        await _DELIVERED.run(
            session,
            [
                {"delivery": o.claimed.delivery_id, "token": o.claimed.token, "ended": o.ended_ms}
                for o in succeeded
            ],
        )
        # One statement for every endpoint: it locks only the rows it changes (endpoints
        # back from failing, seldom more than one).
        endpoints = sorted({o.claimed.endpoint_id for o in succeeded})
        await session.execute(_NOT_FAILING, {"endpoints": endpoints})
    # Failures take endpoint rows too: in endpoint order, as derive does.
    failures = sorted(
        (i for i in range(len(outcomes)) if not outcomes[i].reply.succeeded),
        key=lambda i: outcomes[i].claimed.endpoint_id,
    )
    decided = await _failed(session, [(i, outcomes[i]) for i in failures], disable_after_ms)
    return [decided.get(i, Completion("delivered")) for i in range(len(outcomes))]


def _text(answer: bytes) -> str:
    """An answer's kept bytes as text any database stores: PostgreSQL's text refuses NUL,
    and a receiver may send anything."""
    return answer.decode("utf-8", "replace").replace("\x00", "\ufffd")


# Endpoints back from failing (built once: every pass with a success runs it).
_NOT_FAILING = (
    update(EndpointRow)
    .where(
        EndpointRow.endpoint_id.in_(bindparam("endpoints", expanding=True)),
        EndpointRow.failing_since_ms.is_not(None),
    )
    .values(failing_since_ms=None)
)


@dataclass
class _EndpointState:
    """What a batch of failures has learned of one endpoint: since when it has failed
    (read once), and whether this batch disabled it."""

    since: int | None = None
    since_read: bool = False
    disabled: bool = False


async def _failed(
    session: AsyncSession, failures: list[tuple[int, Outcome]], disable_after_ms: int
) -> dict[int, Completion]:
    """Record failed attempts, decided one by one in the given order, written with one
    UPDATE per kind of change and at most a few statements per endpoint: a batch of many
    failures (dead endpoints timing out together) must not hold the write lock long, since
    every endpoint's outcomes and claims wait for it."""
    decided: dict[int, Completion] = {}
    updates: list[dict[str, Any]] = []
    states: dict[str, _EndpointState] = {}
    for index, outcome in failures:
        claimed, reply, now_ms = outcome.claimed, outcome.reply, outcome.ended_ms
        state = states.setdefault(claimed.endpoint_id, _EndpointState())
        row = {"delivery": claimed.delivery_id, "token": claimed.token, "ended": now_ms}
        if reply.status_code == 410:
            # Stays pending, due at once: enabling the endpoint again sends it first.
            updates.append({**row, "status": "pending", "tried": 0, "next": now_ms})
            disabled = await _disable_once(session, state, claimed.endpoint_id, "gone", now_ms)
            decided[index] = Completion("pending", "gone" if disabled else None)
            continue
        retry_after = None
        if reply.status_code in RETRY_AFTER_STATUSES:
            retry_after = parse_retry_after(reply.retry_after, now_ms)
        wait = retry_wait_ms(claimed.tries + 1, retry_after)
        status = "failed" if wait is None else "pending"
        updates.append({**row, "status": status, "tried": 1, "next": now_ms + (wait or 0)})
        if not state.since_read:
            endpoint = EndpointRow.endpoint_id == claimed.endpoint_id
            await session.execute(
                update(EndpointRow)
                .where(endpoint, EndpointRow.failing_since_ms.is_(None))
                .values(failing_since_ms=now_ms)
            )
            state.since = await session.scalar(select(EndpointRow.failing_since_ms).where(endpoint))
            state.since_read = True
        failing_long = state.since is not None and now_ms - state.since >= disable_after_ms
        if failing_long and await _disable_once(
            session, state, claimed.endpoint_id, "failing", now_ms
        ):
            decided[index] = Completion(status, "failing")
        else:
            decided[index] = Completion(status)
    await _ENDED.run(session, updates)
    return decided


async def _disable_once(
    session: AsyncSession, state: _EndpointState, endpoint_id: str, reason: str, now_ms: int
) -> bool:
    """_disable, skipped once this batch has disabled the endpoint (it would find it
    disabled already)."""
    if state.disabled:
        return False
    state.disabled = await _disable(session, endpoint_id, reason, now_ms)
    return state.disabled


async def _disable(session: AsyncSession, endpoint_id: str, reason: str, now_ms: int) -> bool:
    """Disable an enabled endpoint and put `endpoint.disabled` in the feed; False when it was
    disabled already (so the event is written once per disabling)."""
    result = await session.execute(
        update(EndpointRow)
        .where(EndpointRow.endpoint_id == endpoint_id, EndpointRow.disabled.is_(False))
        .values(disabled=True, disabled_reason=reason)
    )
    if not cast(CursorResult[Any], result).rowcount:
        return False
    data = {"endpoint_id": endpoint_id, "reason": reason}
    key = f"{DISABLED_EVENT}:{endpoint_id}:{now_ms}"
    await record_event(session, Event(DISABLED_EVENT, now_ms, key, data))
    return True


async def fail_unsendable(database: Database, claimed: Claimed, reason: str, now_ms: int) -> None:
    """End a delivery that cannot be sent at all (its body is over the bound): failed,
    with an attempt that says why, so it is listed and can be replayed once fixed."""
    async with database.transaction() as session:
        session.add(
            AttemptRow(
                delivery_id=claimed.delivery_id,
                at_ms=now_ms,
                status_code=None,
                error=reason,
                duration_ms=0,
                answer="",
            )
        )
        await session.execute(
            update(DeliveryRow)
            .where(DeliveryRow.id == claimed.delivery_id, DeliveryRow.claim_token == claimed.token)
            .values(
                status="failed",
                tries=DeliveryRow.tries + 1,
                claim_token=None,
                claim_until_ms=None,
                ended_ms=now_ms,
            )
        )
