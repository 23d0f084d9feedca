"""SQL records of red packets, their grabs, and the ledger of accounts."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import BigInteger, Boolean, DateTime, Integer, String, UniqueConstraint
from sqlalchemy.orm import Mapped, mapped_column

from groupbuy.storage.db import Base

_ID = BigInteger().with_variant(Integer, "sqlite")


class AccountRow(Base):
    """A user's balance, kept equal to the sum of their ledger entries in the same transaction."""

    __tablename__ = "accounts"

    user_id: Mapped[str] = mapped_column(String(64), primary_key=True)
    balance_cents: Mapped[int] = mapped_column(BigInteger, default=0)


class LedgerEntryRow(Base):
    """One movement of money; `business_key` makes applying it twice impossible."""

    __tablename__ = "ledger_entries"

    id: Mapped[int] = mapped_column(_ID, primary_key=True, autoincrement=True)
    business_key: Mapped[str] = mapped_column(String(200), unique=True)
    user_id: Mapped[str] = mapped_column(String(64), index=True)
    kind: Mapped[str] = mapped_column(String(32))  # deposit|packet_debit|grab_credit|refund_credit
    amount_cents: Mapped[int] = mapped_column(BigInteger)  # signed: debits are negative
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))


class PacketRow(Base):
    """A sent packet. `pending` until its Redis state exists; then the outcome is recorded here."""

    __tablename__ = "packets"

    packet_id: Mapped[str] = mapped_column(String(64), primary_key=True)
    sender_id: Mapped[str] = mapped_column(String(64))
    amount_cents: Mapped[int] = mapped_column(BigInteger)
    count: Mapped[int] = mapped_column(Integer)
    strategy: Mapped[str] = mapped_column(String(32))
    expires_in_s: Mapped[int] = mapped_column(Integer)
    status: Mapped[str] = mapped_column(String(16), index=True)  # pending|active|sold_out|expired
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    expires_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    sold_out_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    expired_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    refunded_cents: Mapped[int] = mapped_column(BigInteger, default=0)
    # True once every record of the packet's outbox stream is in SQL and the stream is gone.
    records_done: Mapped[bool] = mapped_column(Boolean, default=False, index=True)
    # True once the repair job removed the ended packet's keys from Redis.
    redis_cleared: Mapped[bool] = mapped_column(Boolean, default=False, index=True)


class GrabRow(Base):
    """One successful grab; the primary key absorbs a redelivered record."""

    __tablename__ = "grabs"
    __table_args__ = (UniqueConstraint("packet_id", "seq"),)

    packet_id: Mapped[str] = mapped_column(String(64), primary_key=True)
    user_id: Mapped[str] = mapped_column(String(64), primary_key=True)
    seq: Mapped[int] = mapped_column(Integer)
    amount_cents: Mapped[int] = mapped_column(BigInteger)
    # indexed: reconciliation looks for the grabs since its last run
    grabbed_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), index=True)
