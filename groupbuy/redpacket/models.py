"""SQL records of red packets, their grabs, and the ledger of accounts."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import (
    BigInteger,
    Boolean,
    DateTime,
    Index,
    Integer,
    LargeBinary,
    String,
    Text,
    UniqueConstraint,
)
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
    # a user's entries newest first, a page at a time
    __table_args__ = (Index("ix_ledger_entries_user_entry", "user_id", "id"),)

    id: Mapped[int] = mapped_column(_ID, primary_key=True, autoincrement=True)
    business_key: Mapped[str] = mapped_column(String(200), unique=True)
    user_id: Mapped[str] = mapped_column(String(64), index=True)
    kind: Mapped[str] = mapped_column(String(32))  # deposit|packet_debit|grab_credit|refund_credit
    amount_cents: Mapped[int] = mapped_column(BigInteger)  # signed: debits are negative
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    # the balance once this entry was applied: set in the transaction that applies it
    balance_after_cents: Mapped[int | None] = mapped_column(BigInteger)


# The SQL statuses of a packet that has ended: nothing can change it any more.
ENDED = ("sold_out", "expired", "withdrawn")


class PacketRow(Base):
    """A sent packet. `pending` until its Redis state exists; then the outcome is recorded here."""

    __tablename__ = "packets"
    # the listing pages newest first, of every packet, of one sender or of one status
    __table_args__ = (
        Index("ix_packets_created", "created_at", "packet_id"),
        Index("ix_packets_sender_created", "sender_id", "created_at", "packet_id"),
        Index("ix_packets_status_created", "status", "created_at", "packet_id"),
    )

    packet_id: Mapped[str] = mapped_column(String(64), primary_key=True)
    sender_id: Mapped[str] = mapped_column(String(64))
    amount_cents: Mapped[int] = mapped_column(BigInteger)
    count: Mapped[int] = mapped_column(Integer)
    strategy: Mapped[str] = mapped_column(String(32))
    expires_in_s: Mapped[int] = mapped_column(Integer)
    # pending|active|sold_out|expired|withdrawn
    status: Mapped[str] = mapped_column(String(16), index=True)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    expires_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    sold_out_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    expired_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    refunded_cents: Mapped[int] = mapped_column(BigInteger, default=0)
    withdrawn_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    # The terms of the send. Rows from before them: no message, anyone may grab.
    message: Mapped[str | None] = mapped_column(String(100))
    recipients_count: Mapped[int] = mapped_column(Integer, default=0)
    sender_may_grab: Mapped[bool] = mapped_column(Boolean, default=True)
    password_salt: Mapped[str | None] = mapped_column(String(32))  # hex
    password_hash: Mapped[str | None] = mapped_column(String(64))  # hex SHA-256(salt + password)
    # SHA-256 over the commitment (groupbuy.redpacket.commitment); null before commitments.
    shares_sha256: Mapped[str | None] = mapped_column(String(64))
    # True once every record of the packet's outbox stream is in SQL and the stream is gone.
    records_done: Mapped[bool] = mapped_column(Boolean, default=False, index=True)
    # True once the repair job removed the ended packet's keys from Redis.
    redis_cleared: Mapped[bool] = mapped_column(Boolean, default=False, index=True)


class PacketContentsRow(Base):
    """What a packet holds besides its row, read only to make it live, rebuild it or
    reveal it: its shares as committed at send, and its recipients."""

    __tablename__ = "packet_contents"

    packet_id: Mapped[str] = mapped_column(String(64), primary_key=True)
    shares_salt: Mapped[bytes] = mapped_column(LargeBinary(16))
    # the amounts in grab order, 8 bytes big-endian each (groupbuy.redpacket.commitment)
    shares: Mapped[bytes] = mapped_column(LargeBinary)
    # the recipients' ids, one per line; '' when anyone may grab
    recipients: Mapped[str] = mapped_column(Text, default="")


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


class PacketEpochRow(Base):
    """How often a live packet was rebuilt in Redis from SQL (no row: never).

    Every outbox record carries the epoch of the Redis state that wrote it; a record of an
    older epoch comes from state Redis lost, so the write-behind fences it out instead of
    applying it on top of shares that were drawn again.
    """

    __tablename__ = "packet_epochs"

    packet_id: Mapped[str] = mapped_column(String(64), primary_key=True)
    epoch: Mapped[int] = mapped_column(Integer)
    rebuilt_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    grabs_kept: Mapped[int] = mapped_column(Integer)


class AcknowledgedGrabRow(Base):
    """A grab some process answered `grabbed`, kept until its grab row is in SQL.

    The answering process writes these in batches, apart from Redis; the write-behind adds
    the records it had to fence out. One that reconciliation cannot match to a grab row
    once nothing is waiting is an acknowledged grab that Redis lost before SQL had it.
    """

    __tablename__ = "acknowledged_grabs"

    packet_id: Mapped[str] = mapped_column(String(64), primary_key=True)
    user_id: Mapped[str] = mapped_column(String(64), primary_key=True)
    epoch: Mapped[int] = mapped_column(Integer, primary_key=True)
    seq: Mapped[int] = mapped_column(Integer)
    amount_cents: Mapped[int] = mapped_column(BigInteger)
    acked_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    source: Mapped[str] = mapped_column(String(16))  # answer | fenced
