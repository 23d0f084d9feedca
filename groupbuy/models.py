"""Imports every SQL model so that Base.metadata knows all tables."""

from groupbuy.events import EventRow
from groupbuy.locks.models import ActivityRow, MemberRow, TeamRow
from groupbuy.reconcile import ReconcileReportRow
from groupbuy.redpacket.models import AccountRow, GrabRow, LedgerEntryRow, PacketRow

__all__ = [
    "AccountRow",
    "ActivityRow",
    "EventRow",
    "GrabRow",
    "LedgerEntryRow",
    "MemberRow",
    "PacketRow",
    "ReconcileReportRow",
    "TeamRow",
]
