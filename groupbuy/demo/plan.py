"""What one demo run does: the options it was given and the sale's parameters drawn from
them (ids, stock, team size, lock lifetimes, when the red-packet storm comes)."""

from __future__ import annotations

import secrets
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

DEFAULT_URL = "http://127.0.0.1:8000"
DEFAULT_DURATION_S = 180.0
DEFAULT_RATE = 50.0
MAX_DURATION_S = 3600.0  # a demo, not a load test: an hour at most
MAX_RATE = 500.0  # requests/s at most: a tenth of what one process serves (benchmarks.md)

TEAM_SIZE = 3
# Short lock lifetimes, so abandoned seats come back (and the line moves) within the demo.
LOCK_TTL_S = 6
OFFER_TTL_S = 6
# A team fails at its deadline: after the demo, so the teams it leaves open show as open.
TEAM_DEADLINE_MARGIN_S = 300
WAITLIST_MAX_LEN = 500
WAITLIST_TTL_S = 60  # an entry the demo stops polling leaves the line a minute later

# A shopper's requests on average (join or open, pay or unlock, a poll of the line): how
# many shoppers arrive each second is the rate over this.
REQUESTS_PER_SHOPPER = 3.0
PAY_SHARE = 0.7  # of the shoppers holding a lock, these pay
UNLOCK_SHARE = 0.15  # these unlock; the rest let the lock expire
PAY_DELAY_S = (0.5, 3.0)  # on the payment page: well within LOCK_TTL_S
UNLOCK_DELAY_S = (0.5, 2.0)
# The stock: this share of the shoppers expected, so the sale sells out and a line forms.
STOCK_SHARE = 0.3
MIN_STOCK = 6
# Waiters poll their place every WAIT_POLL_S; together they take at most this share of the
# rate, which bounds how many wait at once (the others walk away).
WAIT_POLL_S = 2.0
WAITERS_SHARE_OF_RATE = 0.25
MIN_WAITERS = 2
RESTOCK_EVERY_S = 5.0  # the shop looks at its line this often and restocks a sold-out sale
RESTOCK_SHARE = 0.25  # by this share of the first stock (or more, one for each waiting)

STORM_AT_SHARE = 0.3  # the storm comes this far into the run
STORM_MAX_AT_S = 20.0  # and no later than this, so a long run shows it early
STORM_SHARE_OF_REQUESTS = 0.1  # its shares: a tenth of the run's requests, within these
STORM_MIN_SHARES, STORM_MAX_SHARES = 10, 100
STORM_CENTS_PER_SHARE = 100  # 1.00 a share on average
STORM_EXTRA_GRABBERS = 0.2  # more grabbers than shares: the last ones find it sold out


@dataclass(frozen=True)
class DemoOptions:
    """The command line of `groupbuy demo`."""

    url: str
    key: str
    duration_s: float = DEFAULT_DURATION_S
    rate: float = DEFAULT_RATE
    seed: int | None = None
    sign: bool = False
    summary_path: Path | None = None


def problem(options: DemoOptions) -> str | None:
    """Why the options cannot run, or None."""
    if not options.key:
        return "no key: pass --key or set GROUPBUY_KEY (an admin key)"
    if not 0 < options.duration_s <= MAX_DURATION_S:
        return f"--duration must be above 0 and at most {MAX_DURATION_S:g} s"
    if not 0 < options.rate <= MAX_RATE:
        return f"--rate must be above 0 and at most {MAX_RATE:g} requests/s"
    return None


@dataclass(frozen=True)
class Plan:
    """The sale one run plays: its ids and sizes."""

    run_id: str
    duration_s: float
    rate: float
    stock: int
    max_waiters: int
    storm_at_s: float
    storm_shares: int

    @classmethod
    def of(cls, options: DemoOptions, now: datetime | None = None) -> Plan:
        """The plan of a run started `now`: ids made of the time and a random part, so
        runs never collide, whatever their seed."""
        started = now or datetime.now(UTC)
        run_id = f"demo-{started:%Y%m%d-%H%M%S}-{secrets.token_hex(2)}"
        arrivals = options.rate / REQUESTS_PER_SHOPPER * options.duration_s
        shares = round(options.rate * options.duration_s * STORM_SHARE_OF_REQUESTS)
        return cls(
            run_id=run_id,
            duration_s=options.duration_s,
            rate=options.rate,
            stock=max(MIN_STOCK, round(arrivals * STOCK_SHARE)),
            max_waiters=max(MIN_WAITERS, round(options.rate * WAITERS_SHARE_OF_RATE * WAIT_POLL_S)),
            storm_at_s=min(options.duration_s * STORM_AT_SHARE, STORM_MAX_AT_S),
            storm_shares=min(STORM_MAX_SHARES, max(STORM_MIN_SHARES, shares)),
        )

    @property
    def activity_id(self) -> str:
        """The activity the sale runs in."""
        return self.run_id

    @property
    def packet_id(self) -> str:
        """The packet of the storm."""
        return f"{self.run_id}-p1"

    @property
    def sender_id(self) -> str:
        """Who sends the storm's packet."""
        return f"{self.run_id}-sender"

    @property
    def endpoint_id(self) -> str:
        """The webhook endpoint of the demo's receiver."""
        return self.run_id

    @property
    def team_deadline_s(self) -> int:
        """Teams fail after the demo, not during it."""
        return int(self.duration_s) + TEAM_DEADLINE_MARGIN_S

    @property
    def arrivals_per_s(self) -> float:
        """How many shoppers arrive each second."""
        return self.rate / REQUESTS_PER_SHOPPER

    def user(self, number: int) -> str:
        """The id of the run's `number`th shopper."""
        return f"{self.run_id}-u{number}"

    def grabber(self, number: int) -> str:
        """The id of the storm's `number`th grabber."""
        return f"{self.run_id}-g{number}"
