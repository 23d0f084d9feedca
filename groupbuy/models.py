"""Imports every SQL model so that Base.metadata knows all tables."""

from groupbuy.events import EventRow
from groupbuy.locks.models import ActivityRow, MemberRow, TeamRow

__all__ = ["ActivityRow", "EventRow", "MemberRow", "TeamRow"]
