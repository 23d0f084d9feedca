"""The webhook tables: endpoints (with their secrets and feed position), deliveries, attempts.

Times are epoch milliseconds in BIGINT columns: the deliverer compares them with an
injectable clock (tests move it by hours), and integers compare alike on every database.
"""

from __future__ import annotations

from sqlalchemy import BigInteger, Boolean, Index, Integer, String, Text, UniqueConstraint
from sqlalchemy.orm import Mapped, mapped_column

from groupbuy.storage.db import Base

_ID = BigInteger().with_variant(Integer, "sqlite")


class EndpointRow(Base):
    """A registered endpoint: where to POST, what it subscribes to, how to sign, and how far
    into the feed its deliveries have been derived (`position`)."""

    __tablename__ = "webhook_endpoints"

    endpoint_id: Mapped[str] = mapped_column(String(64), primary_key=True)
    url: Mapped[str] = mapped_column(Text)
    # JSON list of event types, or ["*"]
    event_types: Mapped[str] = mapped_column(Text)
    description: Mapped[str | None] = mapped_column(Text, nullable=True)
    ordering: Mapped[str] = mapped_column(String(8))
    disabled: Mapped[bool] = mapped_column(Boolean, default=False)
    # "gone" (a 410), "failing" (disable_after_s) or "admin" (PATCH); null while enabled
    disabled_reason: Mapped[str | None] = mapped_column(String(16), nullable=True)
    secret: Mapped[str] = mapped_column(String(128))
    # The secret before the last rotation, which also signs until previous_until_ms.
    previous_secret: Mapped[str | None] = mapped_column(String(128), nullable=True)
    previous_until_ms: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    # The feed position up to which this endpoint's deliveries exist.
    position: Mapped[int] = mapped_column(BigInteger)
    # When the endpoint's current run of failures began (null after a success).
    failing_since_ms: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    created_ms: Mapped[int] = mapped_column(BigInteger)


class DeliveryRow(Base):
    """One feed event owed to one endpoint: pending until a 2xx (delivered) or the schedule's
    end (failed); `claim_token`/`claim_until_ms` mark the process attempting it now."""

    __tablename__ = "webhook_deliveries"
    __table_args__ = (
        UniqueConstraint("endpoint_id", "event_position", name="uq_webhook_delivery_event"),
        # The deliverer's probe: an endpoint's pending deliveries in feed order.
        Index("ix_webhook_deliveries_due", "endpoint_id", "status", "event_position"),
        # Entity ordering: the earliest pending delivery of one entity.
        Index("ix_webhook_deliveries_entity", "endpoint_id", "entity", "status"),
        # The admin list, newest first (by the end of the last attempt).
        Index("ix_webhook_deliveries_ended", "endpoint_id", "ended_ms"),
    )

    id: Mapped[int] = mapped_column(_ID, primary_key=True, autoincrement=True)
    endpoint_id: Mapped[str] = mapped_column(String(64))
    event_position: Mapped[int] = mapped_column(BigInteger)
    event_type: Mapped[str] = mapped_column(String(64))
    # "team:<activity>/<team>", "packet:<packet>", "endpoint:<endpoint>" or "" (no entity)
    entity: Mapped[str] = mapped_column(String(200))
    entity_version: Mapped[int] = mapped_column(BigInteger)
    status: Mapped[str] = mapped_column(String(16))  # pending | delivered | failed
    # Attempts in the current schedule (a replay starts a new one); the total is in attempts.
    tries: Mapped[int] = mapped_column(Integer, default=0)
    next_ms: Mapped[int] = mapped_column(BigInteger)
    claim_token: Mapped[str | None] = mapped_column(String(32), nullable=True)
    claim_until_ms: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    # When the last attempt ended (null before the first): the admin list shows it from then.
    ended_ms: Mapped[int | None] = mapped_column(BigInteger, nullable=True)


class AttemptRow(Base):
    """One POST of a delivery and what came of it (an HTTP status, or an error)."""

    __tablename__ = "webhook_attempts"
    __table_args__ = (Index("ix_webhook_attempts_delivery", "delivery_id", "id"),)

    id: Mapped[int] = mapped_column(_ID, primary_key=True, autoincrement=True)
    delivery_id: Mapped[int] = mapped_column(BigInteger)
    at_ms: Mapped[int] = mapped_column(BigInteger)
    status_code: Mapped[int | None] = mapped_column(Integer, nullable=True)
    error: Mapped[str | None] = mapped_column(String(200), nullable=True)
    duration_ms: Mapped[int] = mapped_column(Integer)
    # The first 1 KiB of the answer's body, as text (undecodable bytes replaced).
    answer: Mapped[str] = mapped_column(Text)
