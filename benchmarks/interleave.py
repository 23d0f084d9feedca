"""Interleaved measurements: contenders measured in alternation, compared round by round.

This machine's speed drifts between runs and within one (docs/benchmarks-findings.md), so two
figures taken a minute apart compare the machine as much as the code. Here every
contender runs one short fixed-size trial per round, in an order that rotates from round
to round (AB, BA, ... or ABC, BCA, CAB, ...), and each comparison is the ratio of two
contenders' rates *in the same round*: the median over the rounds is the figure, the
lowest and highest round say how far to trust it. A warm-up round runs first and is
dropped. Both levels use it: the engine's trials are coroutines, the HTTP level's are
wrk runs (plain functions).
"""

from __future__ import annotations

import statistics
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from benchmarks.measure import Row


@dataclass
class Trial:
    """One contender's measurement in one round."""

    ops: int
    seconds: float
    correct: dict[str, Any]
    latencies: list[float] = field(default_factory=list)  # seconds, when each call was timed
    percentiles_ms: tuple[float | None, float | None, float | None] | None = None  # else

    @property
    def rate(self) -> float:
        """Operations per second."""
        return self.ops / self.seconds if self.seconds > 0 else 0.0


def rotation(names: Sequence[str], round_index: int) -> list[str]:
    """The order of one round: the names rotated by the round's index (AB, BA, AB, ...)."""
    shift = round_index % len(names)
    return [*names[shift:], *names[:shift]]


def run_sync(
    contenders: dict[str, Callable[[int], Trial]],
    rounds: int,
    between: Callable[[], Any] | None = None,
    say: Callable[[str], None] = print,
) -> dict[str, list[Trial]]:
    """Every contender once per round (round 0 a dropped warm-up), in rotating order;
    `between` runs before each trial (e.g. waits for the servers to be idle)."""
    trials: dict[str, list[Trial]] = {name: [] for name in contenders}
    for index in range(rounds + 1):
        for name in rotation(list(contenders), index):
            if between is not None:
                between()
            trial = contenders[name](index)
            if index:
                trials[name].append(trial)
            say(_progress(index, name, trial))
    return trials


async def run_async(
    contenders: dict[str, Callable[[int], Awaitable[Trial]]],
    rounds: int,
    between: Callable[[], Awaitable[Any]] | None = None,
    say: Callable[[str], None] = print,
) -> dict[str, list[Trial]]:
    """run_sync for coroutine trials."""
    trials: dict[str, list[Trial]] = {name: [] for name in contenders}
    for index in range(rounds + 1):
        for name in rotation(list(contenders), index):
            if between is not None:
                await between()
            trial = await contenders[name](index)
            if index:
                trials[name].append(trial)
            say(_progress(index, name, trial))
    return trials


def _progress(index: int, name: str, trial: Trial) -> str:
    what = "warm-up" if index == 0 else f"round {index}"
    return f"  {what:<8} {name:<34} {trial.rate:>10,.0f} ops/s"


def comparison(
    key: str,
    what: str,
    mine: list[Trial],
    base: list[Trial],
    target: float | None,
    percent: bool = False,
) -> Row:
    """The per-round ratios of two contenders' rates, as a row the ratios table reads:
    median, lowest and highest round, and whether the median meets `target` (a minimum).
    Rows carrying "comparison" are not measurements: the tables and the plot skip them."""
    ratios = [a.rate / b.rate for a, b in zip(mine, base, strict=True) if b.rate > 0]
    median = statistics.median(ratios) if ratios else None
    return {
        "comparison": key,
        "what": what,
        "ratios": [round(r, 4) for r in ratios],
        "median": round(median, 4) if median is not None else None,
        "min": round(min(ratios), 4) if ratios else None,
        "max": round(max(ratios), 4) if ratios else None,
        "rounds": len(ratios),
        "target_min": target,
        "met": None if target is None or median is None else median >= target,
        "percent": percent,  # shown as a percentage rather than a multiple
    }


def merge_correct(parts: list[dict[str, Any]]) -> dict[str, Any]:
    """The correctness counts of several rounds as one: numbers summed, dicts merged by
    key, flags true only when true in every round."""
    merged: dict[str, Any] = {}
    for part in parts:
        for name, value in part.items():
            if isinstance(value, bool):
                merged[name] = merged.get(name, True) and value
            elif isinstance(value, int | float):
                merged[name] = merged.get(name, 0) + value
            elif isinstance(value, dict):
                merged[name] = merge_correct([merged.get(name, {}), value])
            else:
                merged[name] = value
    return merged
