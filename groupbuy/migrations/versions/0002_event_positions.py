"""Events get a feed position, given after commit: the feed serves positions, not ids.

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-23

A nullable, unique `position` on events, and a partial index on the rows that have none
(the sequencer's probe). The rows already there get `position = id`: in id order, and the
ids readers hold as cursors stay the same positions, so nobody re-reads or skips.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision: str | None = "0001"
branch_labels: str | None = None
depends_on: str | None = None

_UNPOSITIONED = sa.text("position IS NULL")


def upgrade() -> None:
    """Add the column, give the existing rows their ids as positions, then the indexes."""
    op.add_column("events", sa.Column("position", sa.BigInteger(), nullable=True))
    op.execute("UPDATE events SET position = id")
    op.create_index("uq_events_position", "events", ["position"], unique=True)
    op.create_index(
        "ix_events_unpositioned",
        "events",
        ["id"],
        postgresql_where=_UNPOSITIONED,
        sqlite_where=_UNPOSITIONED,
    )


def downgrade() -> None:
    """Drop the indexes and the column. The feed goes back to serving ids: a cursor taken
    from a position given after the upgrade is not an id, so a reader resumes from the last
    cursor it held before the upgrade (and reads again what came since)."""
    op.drop_index("ix_events_unpositioned", table_name="events")
    op.drop_index("uq_events_position", table_name="events")
    with op.batch_alter_table("events") as batch:
        batch.drop_column("position")
