"""The table of stored reconciliation reports."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import BigInteger, DateTime, Integer, Text
from sqlalchemy.orm import Mapped, mapped_column

from groupbuy.storage.db import Base


class ReconcileReportRow(Base):
    """One stored report; the newest one is where the next run starts from."""

    __tablename__ = "reconcile_reports"

    id: Mapped[int] = mapped_column(
        BigInteger().with_variant(Integer, "sqlite"), primary_key=True, autoincrement=True
    )
    started_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), index=True)
    finished_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    # The newest ledger entry and event ids this run covered.
    ledger_watermark: Mapped[int] = mapped_column(BigInteger, default=0)
    event_watermark: Mapped[int] = mapped_column(BigInteger, default=0)
    report: Mapped[str] = mapped_column(Text)
