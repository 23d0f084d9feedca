"""What the demo has done so far: its counts, the progress line printed each second and
the summary printed (and written as JSON) at the end."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any


@dataclass
class WebhookCounts:
    """What the loopback receiver got: deliveries verified (each `webhook-id` once),
    repeats of one already verified, and POSTs whose signature did not verify."""

    verified: int = 0
    repeated: int = 0
    unverified: int = 0
    pings: int = 0
    types: Counter[str] = field(default_factory=Counter)


@dataclass
class Tally:
    """The demo's counts; shoppers and the storm add to them, the runner reads them."""

    locks: int = 0
    paid: int = 0
    unlocked: int = 0
    expired: int = 0
    teams_opened: int = 0
    teams_formed: int = 0
    waiting: int = 0  # in the line now
    queued: int = 0  # ever queued
    offered: int = 0
    left_line: int = 0  # entries that ended without an offer (expired, dropped)
    walked_away: int = 0  # found no seat and no room in the demo's line
    restocked: int = 0  # units the shop added
    packet_shares: int = 0
    grabbed: int = 0
    grabs_sold_out: int = 0
    refused: Counter[str] = field(default_factory=Counter)  # unexpected problem codes
    failed: int = 0  # requests that got no answer
    webhooks: WebhookCounts | None = None  # None: no endpoint registered

    @property
    def abandoned(self) -> int:
        """Locks given up: unlocked, or left to expire."""
        return self.unlocked + self.expired

    def line(self, elapsed_s: float, packet_id: str) -> str:
        """The progress line, e.g. `t=12s 12 locks, 9 paid, 2 abandoned, 1 waiting; ...`."""
        parts = [
            f"t={elapsed_s:.0f}s {self.locks} locks, {self.paid} paid, "
            f"{self.abandoned} abandoned, {self.waiting} waiting; "
            f"teams: {self.teams_opened} opened, {self.teams_formed} formed"
        ]
        if self.packet_shares:
            parts.append(f"packet {packet_id}: {self.grabbed}/{self.packet_shares} grabbed")
        parts.append(self._webhooks_text())
        if self.refused or self.failed:
            parts.append(f"refused {sum(self.refused.values())}, no answer {self.failed}")
        return "; ".join(parts)

    def _webhooks_text(self) -> str:
        if self.webhooks is None:
            return "webhooks: off"
        text = f"webhooks: {self.webhooks.verified} verified"
        if self.webhooks.unverified:
            text += f", {self.webhooks.unverified} NOT verified"
        return text

    def summary(self) -> dict[str, Any]:
        """Every count, as the JSON summary holds them."""
        hooks = self.webhooks
        return {
            "locks": self.locks,
            "paid": self.paid,
            "abandoned": self.abandoned,
            "unlocked": self.unlocked,
            "expired": self.expired,
            "teams_opened": self.teams_opened,
            "teams_formed": self.teams_formed,
            "waiting": self.waiting,
            "queued": self.queued,
            "offered": self.offered,
            "left_line": self.left_line,
            "walked_away": self.walked_away,
            "restocked": self.restocked,
            "packet_shares": self.packet_shares,
            "grabbed": self.grabbed,
            "grabs_sold_out": self.grabs_sold_out,
            "refused": dict(sorted(self.refused.items())),
            "no_answer": self.failed,
            "webhooks": None
            if hooks is None
            else {
                "verified": hooks.verified,
                "repeated": hooks.repeated,
                "unverified": hooks.unverified,
                "pings": hooks.pings,
                "types": dict(sorted(hooks.types.items())),
            },
        }
