"""Grabs and locks offered open-loop at half and 80% of the rate measured earlier in the run:
p50/p95/p99 from when each call was due, and whether the generator kept up."""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from functools import partial
from typing import Any

from benchmarks.engine.common import QUICK, Sizes, groupbuy_grab
from benchmarks.harness import gather_limited, make_row, percentile
from groupbuy import errors
from groupbuy.services import Services


@dataclass
class OpenLoop:
    """What an open-loop run measured: latencies from when each call was due, and how
    late the generator itself issued the calls (it shares the process with the service)."""

    latencies: list[float]
    late: list[float]
    issue_seconds: float  # from the first call due to the last one issued
    outcomes: Counter[str]

    def generator(self, rate: float) -> dict[str, Any]:
        """The offered rate achieved and the issue delays; kept_up when the calls went out
        at >= 95% of the rate asked (late calls still count their delay as latency)."""
        late = sorted(self.late)
        issued = len(late) / self.issue_seconds if self.issue_seconds > 0 else 0.0
        return {
            "offered_per_s": round(rate, 1),
            "issued_per_s": round(issued, 1),
            "issue_late_p50_ms": percentile(late, 0.5),
            "issue_late_p99_ms": percentile(late, 0.99),
            "generator_kept_up": issued >= 0.95 * rate,
        }


async def open_loop(call: Callable[[int], Awaitable[str]], rate: float, seconds: float) -> OpenLoop:
    """Issue call(i) at a fixed rate whatever the answers do (an open loop) and return each
    latency measured from the moment it was due, so waiting in a queue counts too."""
    total = max(1, int(rate * seconds))
    latencies: list[float] = []
    late: list[float] = []
    outcomes: Counter[str] = Counter()
    # Only the calls in flight are held: keeping every finished task until the end grew
    # the heap by a task per call, and the collector's pauses with it, which the calls due
    # meanwhile then counted as latency.
    in_flight: set[asyncio.Task[None]] = set()

    async def one(i: int, due: float) -> None:
        outcomes[await call(i)] += 1
        latencies.append(time.perf_counter() - due)

    start = time.perf_counter()
    for i in range(total):
        due = start + i / rate
        delay = due - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        late.append(max(0.0, time.perf_counter() - due))
        task = asyncio.create_task(one(i, due))
        in_flight.add(task)
        task.add_done_callback(in_flight.discard)
    issue_seconds = time.perf_counter() - start
    while in_flight:
        await asyncio.gather(*list(in_flight))
    return OpenLoop(latencies, late, max(issue_seconds, (total - 1) / rate), outcomes)


def rate_label(fraction: float) -> str:
    """'half' for 0.5, else a percentage: the scenario name says which load it was."""
    return "half" if fraction == 0.5 else f"{fraction:.0%}"


async def half_rate(
    services: Services,
    kind: str,
    max_rate: float,
    sizes: Sizes,
    run: str,
    fraction: float = 0.5,
) -> dict[str, Any]:
    """p50/p95/p99 of grabs or locks offered at `fraction` of the rate measured earlier."""
    rate = max_rate * fraction
    seconds = 2.0 if sizes is QUICK else 5.0
    total = max(1, int(rate * seconds))
    tag = f"{run}-{int(fraction * 100)}"
    if kind == "grab":
        # enough packets of at most 5,000 shares (the config caps a packet at 10,000)
        packets = [f"half-{tag}-{p}" for p in range(total // 5000 + 1)]
        await services.packets.accounts.deposit(f"hs-{tag}", len(packets) * 10_000, f"half-{tag}")
        for packet_id in packets:
            await services.packets.sending.send(f"hs-{tag}", 10_000, 5000, packet_id=packet_id)

        async def call(i: int) -> str:
            answer = await groupbuy_grab(services, packets[i % len(packets)], f"h{i}")
            return str(answer["status"])
    else:
        aid = f"half-{tag}"
        await services.teams.activities.create_activity(aid, team_size=50)
        teams = [f"t{t}" for t in range(max(1, total // 40 + 1))]
        await gather_limited(
            [partial(services.teams.activities.open_team, aid, f"L{t}", team_id=t) for t in teams]
        )

        async def call(i: int) -> str:
            try:
                await services.teams.seats.lock(aid, teams[i % len(teams)], f"h{i}")
            except errors.GroupBuyError as exc:
                return exc.code
            return "locked"

    basis = "packets" if kind == "grab" else "teams"
    measured = await open_loop(call, rate, seconds)
    generator = measured.generator(rate)
    label = rate_label(fraction)
    note = (
        f"{kind}s by new users offered at {rate:,.0f}/s ({label} of the {max_rate:,.0f}/s "
        f"of the same kind of {kind}s among 1,000 live {basis} measured above) "
        f"for {seconds:.0f} s, open loop in the service's process; latency from when each call "
        f"was due; issued at {generator['issued_per_s']:,.0f}/s, issue delay p99 "
        f"{generator['issue_late_p99_ms']} ms (counted in the latency)"
    )
    if not generator["generator_kept_up"]:
        note += "; THE GENERATOR FELL BEHIND (issued < 95% of the rate asked)"
    # Every call is a new user on a packet (team) with a share (seat) left for it.
    success = "grabbed" if kind == "grab" else "locked"
    correct = {
        "winners": measured.outcomes[success],
        "spurious_failures": measured.outcomes.total() - measured.outcomes[success],
        "outcomes": dict(measured.outcomes),
        "generator_kept_up": generator["generator_kept_up"],
    }
    return make_row(
        f"{kind} @ {label} max rate", "groupbuy", seconds, measured.latencies, correct, note,
        offered_fraction=fraction, generator=generator,
    )  # fmt: skip


def _rate_of(rows: list[dict[str, Any]], scenario: str, note_part: str = "") -> float:
    for row in rows:
        if (
            row.get("scenario") == scenario
            and row["implementation"] == "groupbuy"
            and note_part in row.get("note", "")
        ):
            return float(row["ops_per_s"])
    return 1000.0
