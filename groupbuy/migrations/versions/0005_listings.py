"""Ledger entries keep the balance after them; teams keep their version; listing indexes.

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-27

`balance_after_cents` is the account's balance once the entry was applied. Rows already
there get the running sum of their user's entries in id order (the balance always equals
the sum of the entries, so the last one of each user ends at the balance). The indexes
serve the newest-first pages: packets of everyone, of a sender or of a status, by
(created_at, packet_id); a user's entries by id.

`teams.version` is the highest team version the team's events carry (0 when none does):
an ended team's body and a rebuild in Redis read it instead of searching the events by
key prefix. Rows already there get it from their events: those of the team engine, whose
dedup key is `<type>:<activity_id>:<team_id>[:...]` and whose data holds `version`.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

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


# The team engine's event types, and how many key parts follow "<type>:<aid>:<tid>".
_TEAM_EVENTS = {
    "team.opened": 0,
    "team.member_joined": 1,
    "team.formed": 0,
    "team.failed": 0,
    "lock.expired": 2,
}
_READ_AT_ONCE = 5000


def _team_versions(rows: Iterable[Any]) -> dict[tuple[str, str], int]:
    """(activity_id, team_id) -> the highest version of the team's events, from (dedup_key,
    data) rows; keys of other shapes and events without a version count for nothing."""
    versions: dict[tuple[str, str], int] = {}
    for dedup_key, data in rows:
        parts = str(dedup_key).split(":")
        if len(parts) != 3 + _TEAM_EVENTS.get(parts[0], -3) or not all(parts):
            continue
        try:
            version = json.loads(data).get("version", 0)
        except (ValueError, AttributeError):  # not JSON, or not an object
            continue
        if isinstance(version, int) and version > 0:
            team = (parts[1], parts[2])
            versions[team] = max(versions.get(team, 0), version)
    return versions


def _backfill_team_versions() -> None:
    """Give every team the version its events carry (read once, a batch of rows at a time)."""
    bind = op.get_bind()
    events = sa.text("SELECT dedup_key, data FROM events WHERE type IN :types").bindparams(
        sa.bindparam("types", list(_TEAM_EVENTS), expanding=True)
    )
    rows = bind.execute(events.execution_options(yield_per=_READ_AT_ONCE))
    versions = _team_versions(rows)
    if versions:
        bind.execute(
            sa.text("UPDATE teams SET version = :v WHERE activity_id = :a AND team_id = :t"),
            [{"v": v, "a": a, "t": t} for (a, t), v in versions.items()],
        )


def upgrade() -> None:
    """Add the columns, fill them for the rows already there, then the indexes."""
    op.add_column("ledger_entries", sa.Column("balance_after_cents", sa.BigInteger()))
    op.execute(_BACKFILL)
    op.add_column("teams", sa.Column("version", sa.Integer(), nullable=False, server_default="0"))
    _backfill_team_versions()
    op.create_index("ix_ledger_entries_user_entry", "ledger_entries", ["user_id", "id"])
    op.create_index("ix_packets_created", "packets", ["created_at", "packet_id"])
    op.create_index(
        "ix_packets_sender_created", "packets", ["sender_id", "created_at", "packet_id"]
    )
    op.create_index("ix_packets_status_created", "packets", ["status", "created_at", "packet_id"])


def downgrade() -> None:
    """Drop the indexes and the columns (the balances themselves stay as they are)."""
    op.drop_index("ix_packets_status_created", table_name="packets")
    op.drop_index("ix_packets_sender_created", table_name="packets")
    op.drop_index("ix_packets_created", table_name="packets")
    op.drop_index("ix_ledger_entries_user_entry", table_name="ledger_entries")
    with op.batch_alter_table("teams") as batch:
        batch.drop_column("version")
    with op.batch_alter_table("ledger_entries") as batch:
        batch.drop_column("balance_after_cents")
