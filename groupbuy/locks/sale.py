"""An activity's sale (SPEC §3 Activities): its schedule, its stock, how long a lock may be
held and whether a late confirm joins. What a create sets, and the refusals the scripts
answer when the sale is not open or has no unit left.

The scripts decide on Redis's clock and counts (lua/_team_lib.lua: `sale_refusal`); the
activity's copy in Redis carries the sale as `starts_ms`, `ends_ms`, `stock`, `max_hold_ms`
and `late_confirm` (groupbuy.locks.activity_copy).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from groupbuy_client.wire import from_ms, iso_ms, to_ms

from groupbuy import errors
from groupbuy.locks.codes import TeamCode, raise_for
from groupbuy.locks.scripts import TeamReply, TeamScripts
from groupbuy.locks.waitlist_rules import WaitlistRules
from groupbuy.storage.specs import ScriptSpec, shape, slots

# The longest a seat lock may be held, in seconds (SPEC: lock_ttl_s..86400).
MAX_HOLD_S = 86_400
# The most units an activity may sell.
MAX_STOCK = 10_000_000


@dataclass(frozen=True)
class Sale:
    """What a create sets of the sale; None: not set (no schedule, no cap, the default)."""

    starts_at: datetime | None = None
    ends_at: datetime | None = None
    stock: int | None = None
    max_hold_s: int | None = None
    late_confirm: bool = False
    waitlist: WaitlistRules | None = None

    def check(self, lock_ttl_s: int) -> None:
        """InvalidRequest (422) for a sale no activity with `lock_ttl_s` may have."""
        if (
            self.starts_at is not None
            and self.ends_at is not None
            and to_ms(self.ends_at) <= to_ms(self.starts_at)
        ):
            raise errors.InvalidRequest("ends_at must be after starts_at")
        if self.max_hold_s is not None and not lock_ttl_s <= self.max_hold_s <= MAX_HOLD_S:
            raise errors.InvalidRequest(
                f"max_hold_s must be between lock_ttl_s ({lock_ttl_s}) and {MAX_HOLD_S}"
            )

    @property
    def sets_any(self) -> bool:
        """Whether the activity needs a rules row for it."""
        return self.late_confirm or any(
            value is not None
            for value in (self.starts_at, self.ends_at, self.stock, self.max_hold_s, self.waitlist)
        )

    def columns(self) -> dict[str, Any]:
        """The activity_rules columns, times to the millisecond (as Redis keeps them)."""
        return {
            "starts_at": _to_the_ms(self.starts_at),
            "ends_at": _to_the_ms(self.ends_at),
            "stock": self.stock,
            "max_hold_s": self.max_hold_s,
            "late_confirm": self.late_confirm or None,
            **(self.waitlist or WaitlistRules()).columns(),
        }

    def shown(self, lock_ttl_s: int) -> dict[str, Any]:
        """The fields of the activity's body this sale sets (None: absent from the body)."""
        return {
            "starts_at": iso_ms(to_ms(self.starts_at)) if self.starts_at else None,
            "ends_at": iso_ms(to_ms(self.ends_at)) if self.ends_at else None,
            "stock": self.stock,
            "max_hold_s": self.max_hold_s or lock_ttl_s,
            "late_confirm": self.late_confirm,
            "waitlist": (self.waitlist or WaitlistRules()).shown(lock_ttl_s),
        }


def _to_the_ms(moment: datetime | None) -> datetime | None:
    return None if moment is None else from_ms(to_ms(moment))


def refuse_for_sale(reply: TeamReply) -> None:
    """Raise for the sale's refusals (not started, ended, sold out); return for any other
    reply."""
    if reply.code is TeamCode.ACTIVITY_NOT_STARTED:
        raise_for(
            reply.code,
            f"the sale opens at {iso_ms(reply.starts_ms)}",
            starts_at=iso_ms(reply.starts_ms),
        )
    if reply.code is TeamCode.ACTIVITY_ENDED:
        raise_for(reply.code, "the sale has ended")
    if reply.code is TeamCode.ACTIVITY_SOLD_OUT:
        raise_for(
            reply.code,
            "every unit of the activity's stock is held by a member or a live lock",
            next_unlock_at=iso_ms(reply.next_unlock_ms),
        )


ACTIVITY_SALE = ScriptSpec(
    "activity_sale",
    "Change an activity's stock and/or end, the stock decided against what is held now.",
    keys=slots(
        ("activity_hash", "the activity's copy of its parameters"),
        ("activity_counts", "hash of the activity's live counts"),
        ("activity_lock_expiries", "zset 'team_id|user_id' -> expiry ms of each seat lock"),
    ),
    args=slots(
        ("shift_ms", "clock shift in ms (0 in production)"),
        ("stock", "the new stock ('' to keep it)"),
        ("ends_ms", "the new end of the sale, ms ('' to keep it)"),
    ),
    replies={
        TeamCode.OK: shape("changed; the units held now", ("held", int)),
        TeamCode.CONFLICT: shape(
            "the new stock is below the units held now (nothing changed)", ("held", int)
        ),
        TeamCode.ACTIVITY_NOT_FOUND: shape(
            "Redis has no copy of the activity, or no counts (put them back, call again)"
        ),
    },
)


async def activity_sale(
    teams: TeamScripts, activity_id: str, stock: int | None, ends_ms: int | None
) -> TeamReply:
    """activity_sale: the new stock and end (None: kept)."""
    k = teams.keys
    keys = ACTIVITY_SALE.key_list(
        activity_hash=k.activity(activity_id),
        activity_counts=k.activity_counts(activity_id),
        activity_lock_expiries=k.lock_expiries(activity_id),
    )
    args = {
        "shift_ms": teams.clock.shift_ms,
        "stock": "" if stock is None else stock,
        "ends_ms": "" if ends_ms is None else ends_ms,
    }
    return await ACTIVITY_SALE.run(teams.caller, keys, args)
