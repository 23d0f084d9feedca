"""Activities get a status (open or closed) and listing indexes; the audit log appears.

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-27

Closing an activity ends its sale early; the status lives here so that a Redis loss
brings it back closed. Every existing activity is open. The audit log keeps who did what
to which target, why and when (never a key's secret).
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision: str | None = "0003"
branch_labels: str | None = None
depends_on: str | None = None


def upgrade() -> None:
    """Add the status and when it closed, then the listings' indexes (newest first: of
    activities, and of an activity's formed or failed teams)."""
    with op.batch_alter_table("activities") as batch:
        batch.add_column(sa.Column("status", sa.String(16), nullable=False, server_default="open"))
        batch.add_column(sa.Column("closed_at", sa.DateTime(timezone=True), nullable=True))
    op.create_index("ix_activities_created", "activities", ["created_at", "activity_id"])
    op.create_index(
        "ix_activities_status_created", "activities", ["status", "created_at", "activity_id"]
    )
    op.create_index("ix_teams_formed", "teams", ["activity_id", "status", "formed_at", "team_id"])
    op.create_index("ix_teams_failed", "teams", ["activity_id", "status", "failed_at", "team_id"])
    op.create_table(
        "audit_log",
        sa.Column(
            "id",
            sa.BigInteger().with_variant(sa.Integer(), "sqlite"),
            primary_key=True,
            autoincrement=True,
        ),
        sa.Column("at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("actor", sa.String(64), nullable=False),
        sa.Column("action", sa.String(64), nullable=False),
        sa.Column("target", sa.String(200), nullable=False),
        sa.Column("reason", sa.Text(), nullable=True),
        sa.Column("detail", sa.JSON(), nullable=True),
    )


def downgrade() -> None:
    """Drop the audit log, the indexes and the two columns: every activity is open again."""
    op.drop_table("audit_log")
    op.drop_index("ix_teams_failed", table_name="teams")
    op.drop_index("ix_teams_formed", table_name="teams")
    op.drop_index("ix_activities_status_created", table_name="activities")
    op.drop_index("ix_activities_created", table_name="activities")
    with op.batch_alter_table("activities") as batch:
        batch.drop_column("closed_at")
        batch.drop_column("status")
