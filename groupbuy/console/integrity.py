"""The reconcile report as three checks an operator reads at a glance: money conserved,
seats within size, grabs recorded — each green or red with its mismatches."""

from __future__ import annotations

from typing import Any

CHECKS: dict[str, tuple[str, ...]] = {
    "money conserved": (
        "account_balance",
        "packet_debit",
        "refund_entry",
        "packet_expired",
        "packet_sold_out",
        "packet_overdrawn",
        "grab_credit_missing",
        "grab_credit_mismatch",
        "credit_without_grab",
        "redis_packet_sum",
        "redis_refund",
        "redis_packet_params",
        "redis_status",
        "redis_packet_missing",
    ),
    "seats within size": (
        "team_overfull",
        "team_duplicate_seq",
        "team_formed_size",
        "redis_team_missing",
        "redis_team_member_count",
        "redis_team_status",
        "redis_member_missing_in_sql",
        "sql_member_missing_in_redis",
        "member_order",
        "stock_overheld",
        "stock_oversold",
        "redis_stock",
    ),
    "grabs recorded": (
        "packet_grab_count",
        "packet_grab_amount",
        "redis_grab_count",
        "redis_grab_missing_in_sql",
        "redis_grab_dead_lettered",
        "sql_grab_missing_in_redis",
        "grab_acknowledged_unrecorded",
        "grab_dead_lettered",
        "redis_grab_amount",
        "packet_commitment",
        "packet_commitment_digest",
    ),
}
"""Each check and the reconcile mismatch kinds (groupbuy/ops/reconcile/rules.py) it covers."""


def checks(report: dict[str, Any] | None) -> list[dict[str, Any]]:
    """Each check with `ok` and its listed mismatches; an unknown kind fails every check
    (a new kind must be placed, not hidden). Without a report: nothing to show."""
    if report is None:
        return []
    mismatches: list[dict[str, Any]] = list(report.get("mismatches") or [])
    known = {kind for kinds in CHECKS.values() for kind in kinds}
    unknown = [m for m in mismatches if m.get("kind") not in known]
    found = []
    for name, kinds in CHECKS.items():
        listed = [m for m in mismatches if m.get("kind") in kinds] + unknown
        found.append({"name": name, "ok": not listed, "mismatches": listed[:50]})
    if report.get("mismatch_count", 0) > len(mismatches):
        # mismatches past the report's listed ones are counted only: they cannot be placed
        for check in found:
            check["ok"] = False
    return found
