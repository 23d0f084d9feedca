"""Webhooks: endpoints with their secrets and feed position, deliveries and their attempts.

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-27

Deliveries are derived from the events table (each endpoint remembers how far), so no
state of webhooks lives only in Redis. Times are epoch milliseconds (BIGINT).
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision: str | None = "0002"
branch_labels: str | None = None
depends_on: str | None = None

# Surrogate ids: BIGINT on PostgreSQL, INTEGER on SQLite (the rowid, which autoincrements).
_ID = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def _ms(name: str, nullable: bool = False) -> sa.Column[int]:
    return sa.Column(name, sa.BigInteger(), nullable=nullable)


def upgrade() -> None:
    """Create the three tables and their indexes."""
    op.create_table(
        "webhook_endpoints",
        sa.Column("endpoint_id", sa.String(64), primary_key=True),
        sa.Column("url", sa.Text(), nullable=False),
        sa.Column("event_types", sa.Text(), nullable=False),
        sa.Column("description", sa.Text(), nullable=True),
        sa.Column("ordering", sa.String(8), nullable=False),
        sa.Column("disabled", sa.Boolean(), nullable=False),
        sa.Column("disabled_reason", sa.String(16), nullable=True),
        sa.Column("secret", sa.String(128), nullable=False),
        sa.Column("previous_secret", sa.String(128), nullable=True),
        _ms("previous_until_ms", nullable=True),
        _ms("position"),
        _ms("failing_since_ms", nullable=True),
        _ms("created_ms"),
    )
    op.create_table(
        "webhook_deliveries",
        sa.Column("id", _ID, primary_key=True, autoincrement=True),
        sa.Column("endpoint_id", sa.String(64), nullable=False),
        _ms("event_position"),
        sa.Column("event_type", sa.String(64), nullable=False),
        sa.Column("entity", sa.String(200), nullable=False),
        _ms("entity_version"),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("tries", sa.Integer(), nullable=False),
        _ms("next_ms"),
        sa.Column("claim_token", sa.String(32), nullable=True),
        _ms("claim_until_ms", nullable=True),
        _ms("ended_ms", nullable=True),
        sa.UniqueConstraint("endpoint_id", "event_position", name="uq_webhook_delivery_event"),
    )
    op.create_index(
        "ix_webhook_deliveries_due",
        "webhook_deliveries",
        ["endpoint_id", "status", "event_position"],
    )
    op.create_index(
        "ix_webhook_deliveries_entity", "webhook_deliveries", ["endpoint_id", "entity", "status"]
    )
    op.create_index(
        "ix_webhook_deliveries_ended", "webhook_deliveries", ["endpoint_id", "ended_ms"]
    )
    op.create_table(
        "webhook_attempts",
        sa.Column("id", _ID, primary_key=True, autoincrement=True),
        sa.Column("delivery_id", sa.BigInteger(), nullable=False),
        _ms("at_ms"),
        sa.Column("status_code", sa.Integer(), nullable=True),
        sa.Column("error", sa.String(200), nullable=True),
        sa.Column("duration_ms", sa.Integer(), nullable=False),
        sa.Column("answer", sa.Text(), nullable=False),
    )
    op.create_index("ix_webhook_attempts_delivery", "webhook_attempts", ["delivery_id", "id"])


def downgrade() -> None:
    """Drop the tables (their indexes go with them)."""
    op.drop_table("webhook_attempts")
    op.drop_table("webhook_deliveries")
    op.drop_table("webhook_endpoints")
