"""The waitlist: how many may wait, for how long, and how long an offered lock lives.

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-02

An activity's waitlist rules join its other optional rules in `activity_rules`. The line
itself lives in Redis (an entry waits minutes, not days); its events reach SQL as every
other event does. Existing rows get nulls: the defaults.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision: str | None = "0007"
branch_labels: str | None = None
depends_on: str | None = None


def upgrade() -> None:
    """Add the waitlist's rules."""
    with op.batch_alter_table("activity_rules") as batch:
        batch.add_column(sa.Column("waitlist_max_len", sa.Integer(), nullable=True))
        batch.add_column(sa.Column("waitlist_ttl_s", sa.Integer(), nullable=True))
        batch.add_column(sa.Column("waitlist_offer_ttl_s", sa.Integer(), nullable=True))


def downgrade() -> None:
    """Drop the waitlist's rules."""
    with op.batch_alter_table("activity_rules") as batch:
        batch.drop_column("waitlist_offer_ttl_s")
        batch.drop_column("waitlist_ttl_s")
        batch.drop_column("waitlist_max_len")
