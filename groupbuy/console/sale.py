"""An activity's sale as the console shows it: the seats held against the stock, the
waitlist, and the funnel of its seat locks over the last minutes (groupbuy/locks/funnel.py).

One view costs the activity's body (the read the page makes anyway), a TIME and one
pipeline of HGETALL and SCARD in the activity's slot: the same for the page and each live
update.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from groupbuy.locks.funnel import CONFIRMED, EXPIRED, OFFERED, RELEASED, Window
from groupbuy.services import Services

SALE_FIELDS = (
    "seats_held",
    "stock",
    "stock_left",
    "stock_held_by_locks",
    "waiting",
    "waiting_any_team",
    "oldest_waiting_since",
    "locks_taken_window",
    "offered_window",
    "confirmed_window",
    "expired_window",
    "released_window",
    "refused_window",
    "conversion",
    "expired_rate",
)
"""The sale's figures: each is a `data-field` of the activity page, pushed live."""


@dataclass(frozen=True)
class SaleView:
    """The figures of one activity's sale and its refusals by code over the window."""

    fields: dict[str, Any]
    refused: dict[str, int]
    minutes: int


def seats(body: Mapping[str, Any]) -> dict[str, Any]:
    """The seats held now against the stock: with a stock, the units members and live locks
    hold (`stock - stock_left`); without one, members and live locks (no cap)."""
    if "stock" in body:
        held = int(body["stock"]) - int(body["stock_left"])
        names = ("stock", "stock_left", "stock_held_by_locks")
        return {"seats_held": held, **{name: body[name] for name in names}}
    if "members" in body and "live_locks" in body:
        return {"seats_held": int(body["members"]) + int(body["live_locks"]), "stock": "no cap"}
    return {"stock": "no cap"}


def funnel(window: Window) -> dict[str, Any]:
    """The funnel's figures over the window; a share is a percentage of the locks begun in
    it (None, shown `–`, before any)."""
    return {
        "locks_taken_window": window.locks,
        "offered_window": window.count(OFFERED),
        "confirmed_window": window.count(CONFIRMED),
        "expired_window": window.count(EXPIRED),
        "released_window": window.count(RELEASED),
        "refused_window": sum(window.refused.values()),
        "conversion": window.share(CONFIRMED),
        "expired_rate": window.share(EXPIRED),
    }


async def sale_view(services: Services, body: Mapping[str, Any]) -> SaleView:
    """The sale of the activity whose body is `body`."""
    window = await services.funnel.store.window(str(body["activity_id"]))
    waitlist = {
        name: body[name]
        for name in ("waiting", "waiting_any_team", "oldest_waiting_since")
        if name in body
    }
    fields = {**seats(body), **waitlist, **funnel(window)}
    return SaleView(fields, window.refused, window.minutes)
