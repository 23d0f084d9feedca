"""Activities get a status (open or closed) and the indexes their listing pages by.

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-27

Closing an activity ends its sale early; the status lives here so that a Redis loss
brings it back closed. Every existing activity is open.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision: str | None = "0003"
branch_labels: str | None = None
depends_on: str | None = None


def upgrade() -> None:
    """Add the status and when it closed, then the listing's indexes (newest first)."""
    with op.batch_alter_table("activities") as batch:
        batch.add_column(sa.Column("status", sa.String(16), nullable=False, server_default="open"))
        batch.add_column(sa.Column("closed_at", sa.DateTime(timezone=True), nullable=True))
    op.create_index("ix_activities_created", "activities", ["created_at", "activity_id"])
    op.create_index(
        "ix_activities_status_created", "activities", ["status", "created_at", "activity_id"]
    )


def downgrade() -> None:
    """Drop the indexes and the two columns: every activity is open again."""
    op.drop_index("ix_activities_status_created", table_name="activities")
    op.drop_index("ix_activities_created", table_name="activities")
    with op.batch_alter_table("activities") as batch:
        batch.drop_column("closed_at")
        batch.drop_column("status")
