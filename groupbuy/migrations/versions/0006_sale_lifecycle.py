"""The sale around the seat lock: schedule, stock, longer holds, leaving, refunds, reasons.

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-02

An activity's sale rules join its other optional rules in `activity_rules`: when the sale
opens and ends, how many units it may sell, how long a lock may be held at most, and
whether a confirm after the lock expired may still join. A member who left an open team
or was refunded from a formed one keeps their row, with when and why. A failed team
keeps why it failed. Every existing row gets nulls: no schedule, no stock, no leave.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision: str | None = "0005"
branch_labels: str | None = None
depends_on: str | None = None


def upgrade() -> None:
    """Add the sale's rules, the members' leave and refund, and the teams' failure reason."""
    with op.batch_alter_table("activity_rules") as batch:
        batch.add_column(sa.Column("starts_at", sa.DateTime(timezone=True), nullable=True))
        batch.add_column(sa.Column("ends_at", sa.DateTime(timezone=True), nullable=True))
        batch.add_column(sa.Column("stock", sa.Integer(), nullable=True))
        batch.add_column(sa.Column("max_hold_s", sa.Integer(), nullable=True))
        batch.add_column(sa.Column("late_confirm", sa.Boolean(), nullable=True))
    with op.batch_alter_table("team_members") as batch:
        batch.add_column(sa.Column("left_at", sa.DateTime(timezone=True), nullable=True))
        batch.add_column(sa.Column("refunded_at", sa.DateTime(timezone=True), nullable=True))
        batch.add_column(sa.Column("leave_reason", sa.String(200), nullable=True))
    with op.batch_alter_table("teams") as batch:
        batch.add_column(sa.Column("failed_reason", sa.String(16), nullable=True))


def downgrade() -> None:
    """Drop what upgrade added: no schedule, stock, leave, refund or reason remains."""
    with op.batch_alter_table("teams") as batch:
        batch.drop_column("failed_reason")
    with op.batch_alter_table("team_members") as batch:
        batch.drop_column("leave_reason")
        batch.drop_column("refunded_at")
        batch.drop_column("left_at")
    with op.batch_alter_table("activity_rules") as batch:
        batch.drop_column("late_confirm")
        batch.drop_column("max_hold_s")
        batch.drop_column("stock")
        batch.drop_column("ends_at")
        batch.drop_column("starts_at")
