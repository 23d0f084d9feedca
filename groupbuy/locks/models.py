"""SQL records of the group-buy engine: activities, teams and their members."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import (
    Boolean,
    DateTime,
    ForeignKey,
    Index,
    Integer,
    String,
    UniqueConstraint,
)
from sqlalchemy.orm import Mapped, mapped_column, relationship

from groupbuy.locks.waitlist_rules import waitlist_body
from groupbuy.storage.db import Base


class ActivityRow(Base):
    """An activity and its immutable parameters."""

    __tablename__ = "activities"
    # the listing pages newest first, of every activity or of one status
    __table_args__ = (
        Index("ix_activities_created", "created_at", "activity_id"),
        Index("ix_activities_status_created", "status", "created_at", "activity_id"),
    )

    activity_id: Mapped[str] = mapped_column(String(64), primary_key=True)
    name: Mapped[str | None] = mapped_column(String(200))
    team_size: Mapped[int] = mapped_column(Integer)
    lock_ttl_s: Mapped[int] = mapped_column(Integer)
    team_deadline_s: Mapped[int] = mapped_column(Integer)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    # open | closed: a closed activity takes no new team, lock or join (a Redis loss
    # brings it back closed from here)
    status: Mapped[str] = mapped_column(String(16), server_default="open")
    closed_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    # loaded with the activity (one more SELECT by key), absent when it sets no rule
    rules: Mapped[ActivityRulesRow | None] = relationship(lazy="selectin")

    @property
    def virtual_min_members(self) -> int | None:
        """The virtual completion threshold, or None when teams simply fail."""
        return self.rules.virtual_min_members if self.rules else None

    @property
    def teams_per_user(self) -> int | None:
        """How many teams a user may belong to, or None for no limit."""
        return self.rules.teams_per_user if self.rules else None

    @property
    def open_teams_per_leader(self) -> int | None:
        """How many open teams a leader may lead at once, or None for no limit."""
        return self.rules.open_teams_per_leader if self.rules else None

    @property
    def starts_at(self) -> datetime | None:
        """When the sale opens (None: it is open from its creation)."""
        return self.rules.starts_at if self.rules else None

    @property
    def ends_at(self) -> datetime | None:
        """When the sale ends (None: it runs until closed)."""
        return self.rules.ends_at if self.rules else None

    @property
    def stock(self) -> int | None:
        """The units the activity may sell, or None for no cap."""
        return self.rules.stock if self.rules else None

    @property
    def max_hold_s(self) -> int:
        """The longest a seat lock may be held, in seconds (lock_ttl_s unless set)."""
        held = self.rules.max_hold_s if self.rules else None
        return held or self.lock_ttl_s

    @property
    def waitlist(self) -> dict[str, int]:
        """The waitlist's max_len, ttl_s and offer_ttl_s, defaults filled in."""
        r = self.rules
        return waitlist_body(
            r.waitlist_max_len if r else None,
            r.waitlist_ttl_s if r else None,
            r.waitlist_offer_ttl_s if r else None,
            self.lock_ttl_s,
        )

    @property
    def late_confirm(self) -> bool:
        """Whether a confirm after its lock expired may still join (SPEC §3 Teams)."""
        return bool(self.rules.late_confirm) if self.rules else False


class ActivityRulesRow(Base):
    """The optional rules of an activity (a row only when it sets one).

    Kept beside `activities` rather than in it so that a database created before the rules
    existed gains them with a new table, not a changed one.
    """

    __tablename__ = "activity_rules"

    activity_id: Mapped[str] = mapped_column(
        String(64), ForeignKey("activities.activity_id"), primary_key=True
    )
    # at the deadline a team with at least this many real members is formed, not failed
    virtual_min_members: Mapped[int | None] = mapped_column(Integer)
    # how many teams of the activity a user may belong to (open or formed)
    teams_per_user: Mapped[int | None] = mapped_column(Integer)
    # how many open teams one leader may lead at once
    open_teams_per_leader: Mapped[int | None] = mapped_column(Integer)
    # the sale (SPEC §3 Activities): opening and ending times, units it may sell, the
    # longest a lock may be held, whether a confirm after its lock expired may still join
    starts_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    ends_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    stock: Mapped[int | None] = mapped_column(Integer)
    max_hold_s: Mapped[int | None] = mapped_column(Integer)
    late_confirm: Mapped[bool | None] = mapped_column(Boolean)
    # the waitlist (SPEC §3 "Waitlist"): entries at most, an entry's and an offer's lifetime
    waitlist_max_len: Mapped[int | None] = mapped_column(Integer)
    waitlist_ttl_s: Mapped[int | None] = mapped_column(Integer)
    waitlist_offer_ttl_s: Mapped[int | None] = mapped_column(Integer)


class TeamRow(Base):
    """A team as last recorded from Redis (the record; Redis holds the live state)."""

    __tablename__ = "teams"
    # an activity's formed or failed teams, newest end first
    __table_args__ = (
        Index("ix_teams_formed", "activity_id", "status", "formed_at", "team_id"),
        Index("ix_teams_failed", "activity_id", "status", "failed_at", "team_id"),
    )

    activity_id: Mapped[str] = mapped_column(
        String(64), ForeignKey("activities.activity_id"), primary_key=True
    )
    team_id: Mapped[str] = mapped_column(String(64), primary_key=True)
    leader_id: Mapped[str] = mapped_column(String(64))
    status: Mapped[str] = mapped_column(String(16))
    size: Mapped[int] = mapped_column(Integer)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    deadline_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    formed_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    failed_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    # True once the repair job removed the ended team's keys from Redis.
    redis_cleared: Mapped[bool] = mapped_column(Boolean, default=False, index=True)
    # The highest team version the applied records carry (SPEC §3 `version`): what an
    # ended team's body shows, and where a rebuild in Redis counts on from.
    version: Mapped[int] = mapped_column(Integer, server_default="0")
    # why a failed team failed: deadline | dissolved | abandoned (null: open, formed, or
    # failed before reasons were kept, at its deadline)
    failed_reason: Mapped[str | None] = mapped_column(String(16))


class MemberRow(Base):
    """A paid member of a team; one row per team and user."""

    __tablename__ = "team_members"
    __table_args__ = (UniqueConstraint("activity_id", "team_id", "seq"),)

    activity_id: Mapped[str] = mapped_column(String(64), primary_key=True)
    team_id: Mapped[str] = mapped_column(String(64), primary_key=True)
    user_id: Mapped[str] = mapped_column(String(64), primary_key=True)
    order_id: Mapped[str | None] = mapped_column(String(64))
    seq: Mapped[int] = mapped_column(Integer)
    joined_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    # a member who left an open team (its seat freed) or was refunded from a formed one
    # (still listed): when, and the shop's reason
    left_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    refunded_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    leave_reason: Mapped[str | None] = mapped_column(String(200))
