"""Grading a flash of "join any team" calls, as the tests and the benchmark both check it."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Tap:
    """One shopper's join: what it answered, and when the call began and ended (any clock
    that both share, e.g. time.perf_counter)."""

    user: str
    outcome: str  # locked | existing | no_team_available | another error code
    team_id: str | None
    began: float
    ended: float


def wrong_refusals(taps: Sequence[Tap], free_seats: int) -> int:
    """no_team_available answers given while a seat was free, in a flash where seats are only
    taken (no unlock, expiry or payment meanwhile): a refusal is wrong if a join that began
    after it ended still got a seat (that seat was free at the refusal too), and every
    refusal is wrong if fewer locks were granted than there were seats and shoppers."""
    refusals = [t for t in taps if t.outcome == "no_team_available"]
    granted = [t for t in taps if t.outcome == "locked"]
    if len(granted) < min(free_seats, len({t.user for t in taps})):
        return len(refusals)
    last_grant_began = max((t.began for t in granted), default=float("-inf"))
    return sum(1 for t in refusals if t.ended < last_grant_began)


def grade_joins(taps: Sequence[Tap], free_seats: int, seats_per_team: int) -> dict[str, Any]:
    """The correctness counts of a flash of joins: locks granted, teams given more locks than
    they had free seats, users granted twice, wrong no_team_available answers, and answers
    that are none of locked / existing / no_team_available."""
    granted = [t for t in taps if t.outcome == "locked"]
    per_team = Counter(t.team_id for t in granted)
    per_user = Counter(t.user for t in granted)
    outcomes = Counter(t.outcome for t in taps)
    return {
        "winners": len(granted),
        "seats": free_seats,
        "over_capacity": sum(1 for n in per_team.values() if n > seats_per_team),
        "duplicates": sum(1 for n in per_user.values() if n > 1),
        "wrong_no_team_available": wrong_refusals(taps, free_seats),
        "spurious_failures": sum(
            n for o, n in outcomes.items() if o not in ("locked", "existing", "no_team_available")
        ),
        "outcomes": dict(outcomes),
    }
