"""Statements run once per row with the rows handed to the driver as tuples
(groupbuy/storage/many.py), on SQLite and PostgreSQL: they write what SQLAlchemy's own
executemany writes, and refuse what they cannot pass on unconverted."""

from __future__ import annotations

from typing import Any

import pytest
from sqlalchemy import bindparam, select, update
from sqlalchemy.dialects import postgresql, sqlite

from groupbuy.storage.db import Database, named_dialect_insert
from groupbuy.storage.events import EventRow
from groupbuy.storage.many import ManyRows
from groupbuy.webhooks.models import DeliveryRow


def delivery(position: int, entity: str) -> dict[str, Any]:
    return {
        "endpoint_id": "shop",
        "event_position": position,
        "event_type": "team.formed",
        "entity": entity,
        "entity_version": position,
        "status": "pending",
        "tries": 0,
        "next_ms": 1_000 + position,
        "ended_ms": None,
    }


INSERT = ManyRows(
    lambda dialect: named_dialect_insert(dialect, DeliveryRow.__table__).on_conflict_do_nothing()
)
# A value from each row, values the statement carries (a string, an expression's
# operand, a NULL), and a parameter named twice.
DELIVERED = ManyRows(
    lambda _: (
        update(DeliveryRow)
        .where(DeliveryRow.id == bindparam("delivery"), DeliveryRow.status == "pending")
        .values(
            status="delivered",
            tries=DeliveryRow.tries + 2,
            claim_token=None,
            ended_ms=bindparam("ended"),
            next_ms=bindparam("ended"),
        )
    )
)
# One parameter only (a one-item tuple per row).
FORGET = ManyRows(
    lambda _: update(DeliveryRow).where(DeliveryRow.id == bindparam("delivery")).values(tries=0)
)


async def rows(db: Database) -> list[tuple[Any, ...]]:
    table = DeliveryRow
    async with db.sessions() as session:
        found = await session.execute(
            select(
                table.event_position,
                table.entity,
                table.status,
                table.tries,
                table.next_ms,
                table.claim_token,
                table.ended_ms,
            ).order_by(table.event_position)
        )
        return [tuple(row) for row in found]


async def test_rows_are_written_as_sqlalchemy_writes_them(db: Database) -> None:
    async with db.transaction() as session:
        await INSERT.run(session, [delivery(1, "team:a/1"), delivery(2, "")])
        # The same event again is left as it is (ON CONFLICT DO NOTHING), a new one goes in.
        await INSERT.run(session, [delivery(2, "changed"), delivery(3, "packet:p")])
        await INSERT.run(session, [])
    assert await rows(db) == [
        (1, "team:a/1", "pending", 0, 1_001, None, None),
        (2, "", "pending", 0, 1_002, None, None),
        (3, "packet:p", "pending", 0, 1_003, None, None),
    ]
    async with db.sessions() as session:
        ids = dict(
            (await session.execute(select(DeliveryRow.event_position, DeliveryRow.id))).all()
        )
    async with db.transaction() as session:
        await session.execute(update(DeliveryRow).values(claim_token="held"))
        await DELIVERED.run(
            session, [{"delivery": ids[1], "ended": 7_000}, {"delivery": ids[3], "ended": 9_000}]
        )
        await FORGET.run(session, [{"delivery": ids[3]}])
    assert await rows(db) == [
        (1, "team:a/1", "delivered", 2, 7_000, None, 7_000),
        (2, "", "pending", 0, 1_002, "held", None),
        (3, "packet:p", "delivered", 0, 9_000, None, 9_000),
    ]


async def test_a_row_without_a_needed_value_is_refused(db: Database) -> None:
    async with db.transaction() as session:
        with pytest.raises(KeyError):
            await DELIVERED.run(session, [{"delivery": 1}])


@pytest.mark.parametrize("dialect", [sqlite.dialect(), postgresql.asyncpg.dialect()])  # type: ignore[no-untyped-call]
def test_what_cannot_be_passed_on_as_it_is_is_refused(dialect: Any) -> None:
    # An expanding IN is rendered at execution.
    expanding = ManyRows(
        lambda _: update(DeliveryRow).where(DeliveryRow.id.in_([1, 2])).values(tries=0)
    )
    with pytest.raises(ValueError, match="expanding"):
        expanding._for(dialect, ())
    # A column left out of the rows whose default Python computes (tries defaults to 0).
    partial = {k: v for k, v in delivery(1, "").items() if k != "tries"}
    with pytest.raises(ValueError, match="default"):
        INSERT._for(dialect, tuple(partial))


def test_a_value_sqlite_converts_is_refused() -> None:
    # SQLite's driver takes a datetime only through SQLAlchemy's conversion to text.
    events = ManyRows(lambda _: update(EventRow).values(at=bindparam("at")))
    with pytest.raises(ValueError, match="converting"):
        events._for(sqlite.dialect(), ("at",))
