"""The initial schema: every table as the versions before migrations made it with create_all.

Revision ID: 0001
Revises:
Create Date: 2026-11-23
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision: str | None = None
branch_labels: str | None = None
depends_on: str | None = None

# Surrogate ids: BIGINT on PostgreSQL, INTEGER on SQLite (where only INTEGER PRIMARY KEY is
# the rowid, which autoincrements).
_ID = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def _when(name: str, nullable: bool = False, index: bool = False) -> sa.Column[object]:
    return sa.Column(name, sa.DateTime(timezone=True), nullable=nullable, index=index)


def schema() -> sa.MetaData:
    """The tables of this revision, written out here (not imported from the models, which
    move on with later revisions). A database the earlier versions made with create_all is
    checked against them before it is stamped with this revision."""
    metadata = sa.MetaData()
    key = sa.String(64)
    sa.Table(
        "activities",
        metadata,
        sa.Column("activity_id", key, primary_key=True),
        sa.Column("name", sa.String(200), nullable=True),
        sa.Column("team_size", sa.Integer(), nullable=False),
        sa.Column("lock_ttl_s", sa.Integer(), nullable=False),
        sa.Column("team_deadline_s", sa.Integer(), nullable=False),
        _when("created_at"),
    )
    sa.Table(
        "activity_rules",
        metadata,
        sa.Column("activity_id", key, sa.ForeignKey("activities.activity_id"), primary_key=True),
        sa.Column("virtual_min_members", sa.Integer(), nullable=True),
        sa.Column("teams_per_user", sa.Integer(), nullable=True),
        sa.Column("open_teams_per_leader", sa.Integer(), nullable=True),
    )
    sa.Table(
        "teams",
        metadata,
        sa.Column("activity_id", key, sa.ForeignKey("activities.activity_id"), primary_key=True),
        sa.Column("team_id", key, primary_key=True),
        sa.Column("leader_id", key, nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("size", sa.Integer(), nullable=False),
        _when("created_at"),
        _when("deadline_at"),
        _when("formed_at", nullable=True),
        _when("failed_at", nullable=True),
        sa.Column("redis_cleared", sa.Boolean(), nullable=False, index=True),
    )
    sa.Table(
        "team_members",
        metadata,
        sa.Column("activity_id", key, primary_key=True),
        sa.Column("team_id", key, primary_key=True),
        sa.Column("user_id", key, primary_key=True),
        sa.Column("order_id", key, nullable=True),
        sa.Column("seq", sa.Integer(), nullable=False),
        _when("joined_at"),
        sa.UniqueConstraint("activity_id", "team_id", "seq"),
    )
    sa.Table(
        "accounts",
        metadata,
        sa.Column("user_id", key, primary_key=True),
        sa.Column("balance_cents", sa.BigInteger(), nullable=False),
    )
    sa.Table(
        "ledger_entries",
        metadata,
        sa.Column("id", _ID, primary_key=True, autoincrement=True),
        sa.Column("business_key", sa.String(200), nullable=False, unique=True),
        sa.Column("user_id", key, nullable=False, index=True),
        sa.Column("kind", sa.String(32), nullable=False),
        sa.Column("amount_cents", sa.BigInteger(), nullable=False),
        _when("created_at"),
    )
    sa.Table(
        "packets",
        metadata,
        sa.Column("packet_id", key, primary_key=True),
        sa.Column("sender_id", key, nullable=False),
        sa.Column("amount_cents", sa.BigInteger(), nullable=False),
        sa.Column("count", sa.Integer(), nullable=False),
        sa.Column("strategy", sa.String(32), nullable=False),
        sa.Column("expires_in_s", sa.Integer(), nullable=False),
        sa.Column("status", sa.String(16), nullable=False, index=True),
        _when("created_at"),
        _when("expires_at"),
        _when("sold_out_at", nullable=True),
        _when("expired_at", nullable=True),
        sa.Column("refunded_cents", sa.BigInteger(), nullable=False),
        sa.Column("records_done", sa.Boolean(), nullable=False, index=True),
        sa.Column("redis_cleared", sa.Boolean(), nullable=False, index=True),
    )
    sa.Table(
        "grabs",
        metadata,
        sa.Column("packet_id", key, primary_key=True),
        sa.Column("user_id", key, primary_key=True),
        sa.Column("seq", sa.Integer(), nullable=False),
        sa.Column("amount_cents", sa.BigInteger(), nullable=False),
        _when("grabbed_at", index=True),
        sa.UniqueConstraint("packet_id", "seq"),
    )
    sa.Table(
        "packet_epochs",
        metadata,
        sa.Column("packet_id", key, primary_key=True),
        sa.Column("epoch", sa.Integer(), nullable=False),
        _when("rebuilt_at"),
        sa.Column("grabs_kept", sa.Integer(), nullable=False),
    )
    sa.Table(
        "acknowledged_grabs",
        metadata,
        sa.Column("packet_id", key, primary_key=True),
        sa.Column("user_id", key, primary_key=True),
        sa.Column("epoch", sa.Integer(), primary_key=True, autoincrement=False),
        sa.Column("seq", sa.Integer(), nullable=False),
        sa.Column("amount_cents", sa.BigInteger(), nullable=False),
        _when("acked_at"),
        sa.Column("source", sa.String(16), nullable=False),
    )
    sa.Table(
        "events",
        metadata,
        sa.Column("id", _ID, primary_key=True, autoincrement=True),
        sa.Column("type", key, nullable=False),
        _when("at"),
        sa.Column("dedup_key", sa.String(300), nullable=False, unique=True),
        sa.Column("data", sa.Text(), nullable=False),
    )
    sa.Table(
        "dead_letters",
        metadata,
        sa.Column("id", _ID, primary_key=True, autoincrement=True),
        sa.Column("stream", sa.String(16), nullable=False),
        sa.Column("owner_id", key, nullable=False),
        sa.Column("entry_id", key, nullable=False),
        sa.Column("record_type", key, nullable=True),
        sa.Column("user_id", sa.String(300), nullable=True, index=True),
        sa.Column("fields", sa.Text(), nullable=False),
        sa.Column("error", sa.Text(), nullable=False),
        _when("dead_at"),
        _when("replayed_at", nullable=True),
        sa.UniqueConstraint("stream", "owner_id", "entry_id"),
    )
    sa.Table(
        "blocked_users",
        metadata,
        sa.Column("user_id", key, primary_key=True),
        sa.Column("reason", sa.String(500), nullable=True),
        _when("blocked_at"),
    )
    sa.Table(
        "reconcile_reports",
        metadata,
        sa.Column("id", _ID, primary_key=True, autoincrement=True),
        _when("started_at", index=True),
        _when("finished_at"),
        sa.Column("ledger_watermark", sa.BigInteger(), nullable=False),
        sa.Column("event_watermark", sa.BigInteger(), nullable=False),
        sa.Column("report", sa.Text(), nullable=False),
    )
    return metadata


def upgrade() -> None:
    # checkfirst=False: a table already there is an error here, never silently kept (a
    # database made by create_all is checked and stamped instead: groupbuy.migrations).
    schema().create_all(op.get_bind(), checkfirst=False)


def downgrade() -> None:
    schema().drop_all(op.get_bind(), checkfirst=False)
