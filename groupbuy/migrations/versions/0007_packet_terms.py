"""Red packets as people send them: terms, committed shares, withdrawal.

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-02

A packet keeps its greeting, how many recipients it has, whether its sender may grab it,
its password as a salted hash, the commitment to its shares, and when it was withdrawn.
Its shares as drawn at send, their salt and its recipients go to `packet_contents`, read
only to make the packet live, rebuild it or reveal it. Existing packets keep no terms
and no commitment: anyone may grab them, as before.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision: str | None = "0006"
branch_labels: str | None = None
depends_on: str | None = None


def upgrade() -> None:
    """Add the packets' terms and commitment, and the table of their contents."""
    with op.batch_alter_table("packets") as batch:
        batch.add_column(sa.Column("withdrawn_at", sa.DateTime(timezone=True), nullable=True))
        batch.add_column(sa.Column("message", sa.String(100), nullable=True))
        batch.add_column(
            sa.Column("recipients_count", sa.Integer(), nullable=False, server_default="0")
        )
        batch.add_column(
            sa.Column("sender_may_grab", sa.Boolean(), nullable=False, server_default=sa.true())
        )
        batch.add_column(sa.Column("password_salt", sa.String(32), nullable=True))
        batch.add_column(sa.Column("password_hash", sa.String(64), nullable=True))
        batch.add_column(sa.Column("shares_sha256", sa.String(64), nullable=True))
    op.create_table(
        "packet_contents",
        sa.Column("packet_id", sa.String(64), primary_key=True),
        sa.Column("shares_salt", sa.LargeBinary(16), nullable=False),
        sa.Column("shares", sa.LargeBinary(), nullable=False),
        sa.Column("recipients", sa.Text(), nullable=False),
    )


def downgrade() -> None:
    """Drop what upgrade added: packets lose their terms, commitment and contents."""
    op.drop_table("packet_contents")
    with op.batch_alter_table("packets") as batch:
        batch.drop_column("shares_sha256")
        batch.drop_column("password_hash")
        batch.drop_column("password_salt")
        batch.drop_column("sender_may_grab")
        batch.drop_column("recipients_count")
        batch.drop_column("message")
        batch.drop_column("withdrawn_at")
