"""Ledger entries keep the balance after them; packets and entries get listing indexes.

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-27

`balance_after_cents` is the account's balance once the entry was applied. Rows already
there get the running sum of their user's entries in id order (the balance always equals
the sum of the entries, so the last one of each user ends at the balance). The indexes
serve the newest-first pages: packets of everyone, of a sender or of a status, by
(created_at, packet_id); a user's entries by id.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision: str | None = "0004"
branch_labels: str | None = None
depends_on: str | None = None

# A window function: SQLite has them since 3.25, PostgreSQL always.
_BACKFILL = """
UPDATE ledger_entries SET balance_after_cents = (
    SELECT running.total FROM (
        SELECT id, SUM(amount_cents) OVER (PARTITION BY user_id ORDER BY id) AS total
        FROM ledger_entries
    ) AS running
    WHERE running.id = ledger_entries.id
)
"""


def upgrade() -> None:
    """Add the column, fill it for the rows already there, then the indexes."""
    op.add_column("ledger_entries", sa.Column("balance_after_cents", sa.BigInteger()))
    op.execute(_BACKFILL)
    op.create_index("ix_ledger_entries_user_entry", "ledger_entries", ["user_id", "id"])
    op.create_index("ix_packets_created", "packets", ["created_at", "packet_id"])
    op.create_index(
        "ix_packets_sender_created", "packets", ["sender_id", "created_at", "packet_id"]
    )
    op.create_index("ix_packets_status_created", "packets", ["status", "created_at", "packet_id"])


def downgrade() -> None:
    """Drop the indexes and the column (the balances themselves stay as they are)."""
    op.drop_index("ix_packets_status_created", table_name="packets")
    op.drop_index("ix_packets_sender_created", table_name="packets")
    op.drop_index("ix_packets_created", table_name="packets")
    op.drop_index("ix_ledger_entries_user_entry", table_name="ledger_entries")
    with op.batch_alter_table("ledger_entries") as batch:
        batch.drop_column("balance_after_cents")
