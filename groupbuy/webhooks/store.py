"""Endpoints in SQL: register (idempotent by id), read, list, change, delete, rotate the
secret. A secret leaves this module only in the answers of a creation and a rotation."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from groupbuy_client.wire import Outcome, iso_ms
from sqlalchemy import delete, func, select, update
from sqlalchemy.ext.asyncio import AsyncSession

from groupbuy import errors
from groupbuy.storage.db import Database
from groupbuy.storage.events import EventRow, assign_positions
from groupbuy.webhooks.models import AttemptRow, DeliveryRow, EndpointRow
from groupbuy.webhooks.signing import new_secret

ORDERINGS = ("feed", "entity")
ALL_TYPES = "*"


@dataclass(frozen=True)
class EndpointSpec:
    """What a registration asks for (checked by the caller)."""

    endpoint_id: str
    url: str
    event_types: tuple[str, ...]
    description: str | None = None
    ordering: str = "feed"


def subscribes(event_types: list[str], event_type: str) -> bool:
    """Whether an endpoint subscribed to `event_types` gets events of `event_type`."""
    return ALL_TYPES in event_types or event_type in event_types


class Signer(Protocol):
    """What signs an endpoint's deliveries: its secret, and the rotated-out one with the
    end of its overlap (an endpoint's row, or a pass's reading of it)."""

    @property
    def secret(self) -> str: ...

    @property
    def previous_secret(self) -> str | None: ...

    @property
    def previous_until_ms(self) -> int | None: ...


def secrets_in_use(row: Signer, now_ms: int) -> list[str]:
    """The secrets that sign now: the current one, and the rotated-out one while it overlaps."""
    found = [row.secret]
    if row.previous_secret and row.previous_until_ms is not None and now_ms < row.previous_until_ms:
        found.append(row.previous_secret)
    return found


def view(row: EndpointRow) -> dict[str, Any]:
    """An endpoint as the API shows it: everything but its secrets."""
    return {
        "endpoint_id": row.endpoint_id,
        "url": row.url,
        "event_types": json.loads(row.event_types),
        "description": row.description,
        "ordering": row.ordering,
        "disabled": row.disabled,
        "disabled_reason": row.disabled_reason,
        "created_at": iso_ms(row.created_ms),
        "position": row.position,
    }


class EndpointStore:
    """The endpoints' rows; `clock` gives epoch milliseconds (injectable for tests)."""

    def __init__(self, database: Database, clock: Callable[[], int], overlap_s: int) -> None:
        self._db = database
        self._clock = clock
        self._overlap_ms = overlap_s * 1000

    async def create(self, spec: EndpointSpec) -> Outcome:
        """Register an endpoint starting from now (events committed later reach it): 201 with
        its secret; the same id and parameters again: 200 without it; else 409."""
        # Events committed before now get their positions first, so "now" is after them.
        await assign_positions(self._db)
        async with self._db.transaction(urgent=True) as session:
            found = await session.get(EndpointRow, spec.endpoint_id)
            if found is not None:
                return Outcome(self._same(found, spec), created=False)
            top = await session.scalar(select(func.coalesce(func.max(EventRow.position), 0)))
            row = EndpointRow(
                endpoint_id=spec.endpoint_id,
                url=spec.url,
                event_types=json.dumps(list(spec.event_types)),
                description=spec.description,
                ordering=spec.ordering,
                disabled=False,
                disabled_reason=None,
                secret=new_secret(),
                previous_secret=None,
                previous_until_ms=None,
                position=int(top or 0),
                failing_since_ms=None,
                created_ms=self._clock(),
            )
            session.add(row)
            await session.flush()
            return Outcome({**view(row), "secret": row.secret}, created=True)

    @staticmethod
    def _same(row: EndpointRow, spec: EndpointSpec) -> dict[str, Any]:
        asked = (spec.url, list(spec.event_types), spec.description, spec.ordering)
        held = (row.url, json.loads(row.event_types), row.description, row.ordering)
        if asked != held:
            raise errors.Conflict(
                f"the webhook endpoint {row.endpoint_id} exists with other parameters",
                endpoint_id=row.endpoint_id,
            )
        return view(row)

    async def get(self, endpoint_id: str) -> dict[str, Any]:
        """One endpoint (404 endpoint_not_found)."""
        async with self._db.sessions() as session:
            return view(await _row(session, endpoint_id))

    async def row(self, endpoint_id: str) -> EndpointRow:
        """One endpoint's row, secrets included (for signing; never an answer)."""
        async with self._db.sessions() as session:
            return await _row(session, endpoint_id)

    async def rows(self) -> list[EndpointRow]:
        """Every endpoint's row, by id."""
        async with self._db.sessions() as session:
            return list(
                await session.scalars(select(EndpointRow).order_by(EndpointRow.endpoint_id))
            )

    async def page(self, cursor: str | None, limit: int) -> dict[str, Any]:
        """Endpoints by id after `cursor` (the last id of the previous page)."""
        query = select(EndpointRow).order_by(EndpointRow.endpoint_id).limit(limit + 1)
        if cursor:
            query = query.where(EndpointRow.endpoint_id > cursor)
        async with self._db.sessions() as session:
            found = list(await session.scalars(query))
        more = len(found) > limit
        shown = found[:limit]
        return {
            "webhooks": [view(row) for row in shown],
            "next_cursor": shown[-1].endpoint_id if more else None,
        }

    async def update(self, endpoint_id: str, changes: dict[str, Any]) -> dict[str, Any]:
        """Change `url`, `event_types`, `description` or `disabled`; enabling an endpoint
        lets what waited in its queue go."""
        values: dict[str, Any] = {}
        if "url" in changes:
            values["url"] = changes["url"]
        if "event_types" in changes:
            values["event_types"] = json.dumps(list(changes["event_types"]))
        if "description" in changes:
            values["description"] = changes["description"]
        if "disabled" in changes:
            values["disabled"] = bool(changes["disabled"])
            values["disabled_reason"] = "admin" if changes["disabled"] else None
            if not changes["disabled"]:
                values["failing_since_ms"] = None  # a fresh start for disable_after_s
        async with self._db.transaction(urgent=True) as session:
            row = await _row(session, endpoint_id)
            if values.get("disabled") is True and row.disabled:
                values.pop("disabled_reason")  # keep why it was disabled first
            if values:
                await session.execute(
                    update(EndpointRow)
                    .where(EndpointRow.endpoint_id == endpoint_id)
                    .values(**values)
                )
                await session.refresh(row)
            return view(row)

    async def delete(self, endpoint_id: str) -> dict[str, Any]:
        """Remove an endpoint with its deliveries and their attempts."""
        async with self._db.transaction(urgent=True) as session:
            await _row(session, endpoint_id)
            deliveries = select(DeliveryRow.id).where(DeliveryRow.endpoint_id == endpoint_id)
            await session.execute(delete(AttemptRow).where(AttemptRow.delivery_id.in_(deliveries)))
            await session.execute(delete(DeliveryRow).where(DeliveryRow.endpoint_id == endpoint_id))
            await session.execute(delete(EndpointRow).where(EndpointRow.endpoint_id == endpoint_id))
        return {"endpoint_id": endpoint_id, "deleted": True}

    async def rotate(self, endpoint_id: str) -> dict[str, Any]:
        """A new secret; the current one goes on signing beside it for the overlap."""
        now = self._clock()
        async with self._db.transaction(urgent=True) as session:
            row = await _row(session, endpoint_id)
            secret = new_secret()
            await session.execute(
                update(EndpointRow)
                .where(EndpointRow.endpoint_id == endpoint_id)
                .values(
                    secret=secret,
                    previous_secret=row.secret,
                    previous_until_ms=now + self._overlap_ms,
                )
            )
            await session.refresh(row)
            return {
                **view(row),
                "secret": secret,
                "previous_secret_expires_at": iso_ms(now + self._overlap_ms),
            }


async def _row(session: AsyncSession, endpoint_id: str) -> EndpointRow:
    row = await session.get(EndpointRow, endpoint_id)
    if row is None:
        raise errors.EndpointNotFound(f"no webhook endpoint has the id {endpoint_id}")
    return row
