"""The overview's numbers over time: the process's Prometheus metrics sampled into a ring
buffer (the last 10 minutes at one sample a second), and the rates and p99 between samples.

Sampling is driven by the console's readers (a page, a live stream): a sample is taken when
the newest one is older than the interval, so an unwatched console costs nothing.
"""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from groupbuy import metrics

_REQUESTS = "groupbuy_http_request_duration_seconds"
_PROBLEMS = "groupbuy_http_problems"  # a counter family is named without _total
# The statuses of a sale's expected outcomes: a state the request met (409 team_full,
# activity_sold_out, already_locked, ...) or a packet that ended (410), not a mistake of
# the caller's nor of the service's.
OUTCOME_STATUSES = ("409", "410")
_LOCKS = "groupbuy_lock_outcomes"
_GRABS = "groupbuy_grab_outcomes"
_LOCKED = ("locked",)
_GRABBED = ("grabbed",)


@dataclass(frozen=True)
class Sample:
    """Counters read at one moment (totals since the processes started)."""

    at: float
    requests: float = 0.0
    outcomes: float = 0.0  # answered with an OUTCOME_STATUSES status
    client_errors: float = 0.0  # another 4xx
    server_errors: float = 0.0
    locks: float = 0.0
    grabs: float = 0.0
    # problems answered: ((status, code), total), every worker's summed
    problems: tuple[tuple[tuple[str, str], float], ...] = ()
    # request latency: (upper bound in s, cumulative count), summed over routes and statuses
    buckets: tuple[tuple[float, float], ...] = ()
    gauges: dict[str, dict[str, float]] = field(default_factory=dict)


def read_sample(families: Iterable[Any], at: float) -> Sample:
    """One Sample from prometheus-client metric families."""
    totals = {"requests": 0.0, "outcomes": 0.0, "client_errors": 0.0, "server_errors": 0.0}
    locks = grabs = 0.0
    buckets: dict[float, float] = {}
    problems: dict[tuple[str, str], float] = {}
    gauges: dict[str, dict[str, float]] = {}
    for family in families:
        for sample in family.samples:
            name, labels, value = sample.name, sample.labels, float(sample.value)
            if family.name == _REQUESTS and name.endswith("_count"):
                totals["requests"] += value
                status = str(labels.get("status", ""))
                if status in OUTCOME_STATUSES:
                    totals["outcomes"] += value
                elif status.startswith("4"):
                    totals["client_errors"] += value
                elif status.startswith("5"):
                    totals["server_errors"] += value
            elif family.name == _REQUESTS and name.endswith("_bucket"):
                bound = float(labels["le"])
                buckets[bound] = buckets.get(bound, 0.0) + value
            elif family.name == _PROBLEMS and name.endswith("_total"):
                answered = (str(labels["status"]), str(labels["code"]))
                problems[answered] = problems.get(answered, 0.0) + value
            elif family.name == _LOCKS and labels.get("outcome") in _LOCKED:
                locks += value if name.endswith("_total") else 0.0
            elif family.name == _GRABS and labels.get("outcome") in _GRABBED:
                grabs += value if name.endswith("_total") else 0.0
            elif family.type == "gauge":
                label = ",".join(str(v) for k, v in sorted(labels.items()) if k != "pid")
                gauges.setdefault(name, {})[label] = value
            elif family.type == "counter" and name.endswith("_total"):
                label = ",".join(str(v) for k, v in sorted(labels.items()))
                totals_of = gauges.setdefault(name, {})
                totals_of[label] = totals_of.get(label, 0.0) + value
    return Sample(
        at,
        locks=locks,
        grabs=grabs,
        buckets=tuple(sorted(buckets.items())),
        problems=tuple(sorted(problems.items())),
        gauges=gauges,
        **totals,
    )


def quantile(q: float, buckets: list[tuple[float, float]]) -> float | None:
    """The q-quantile from cumulative (bound, count) buckets, interpolated inside its bucket
    as Prometheus' histogram_quantile does; None without observations."""
    if not buckets or buckets[-1][1] <= 0:
        return None
    rank = q * buckets[-1][1]
    lower_bound, lower_count = 0.0, 0.0
    for bound, count in buckets:
        if count >= rank:
            if math.isinf(bound):
                return lower_bound
            if count == lower_count:
                return bound
            return lower_bound + (bound - lower_bound) * (rank - lower_count) / (
                count - lower_count
            )
        lower_bound, lower_count = bound, count
    return lower_bound


@dataclass(frozen=True)
class Rates:
    """Per-second rates and the p99 latency between two samples."""

    seconds: float
    requests: float
    outcomes: float
    client_errors: float
    server_errors: float
    locks: float
    grabs: float
    p99_ms: float | None
    problems: dict[tuple[str, str], float] = field(default_factory=dict)  # by (status, code)


def rates_between(old: Sample, new: Sample) -> Rates:
    """What happened between two samples, per second (a restart's reset counts as 0)."""
    seconds = max(new.at - old.at, 1e-9)

    def rate(name: str) -> float:
        return max(0.0, float(getattr(new, name)) - float(getattr(old, name))) / seconds

    before = dict(old.buckets)
    delta = [(bound, max(0.0, count - before.get(bound, 0.0))) for bound, count in new.buckets]
    p99 = quantile(0.99, delta)
    answered = dict(old.problems)
    problems = {
        key: max(0.0, total - answered.get(key, 0.0)) / seconds for key, total in new.problems
    }
    return Rates(
        seconds,
        rate("requests"),
        rate("outcomes"),
        rate("client_errors"),
        rate("server_errors"),
        rate("locks"),
        rate("grabs"),
        None if p99 is None else round(p99 * 1000, 2),
        problems,
    )


class Sampler:
    """A ring buffer of samples, taken on demand at most once per `interval_s`."""

    def __init__(
        self,
        interval_s: float = 1.0,
        keep: int = 600,
        read: Callable[[], Iterable[Any]] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._interval_s = interval_s
        self._samples: deque[Sample] = deque(maxlen=keep)
        self._read = read or (lambda: metrics.collected().collect())
        self._clock = clock

    def sample(self) -> Sample:
        """The newest sample, taken now when the last one is older than the interval."""
        now = self._clock()
        if self._samples and now - self._samples[-1].at < self._interval_s * 0.9:
            return self._samples[-1]
        taken = read_sample(self._read(), now)
        self._samples.append(taken)
        return taken

    def recent(self, window_s: float = 10.0) -> Rates | None:
        """Rates over about the last `window_s` seconds (None before a second sample)."""
        newest = self.sample()
        older = [s for s in self._samples if s is not newest and newest.at - s.at <= window_s]
        if not older:
            older = [s for s in self._samples if s is not newest][-1:]
        return rates_between(older[0], newest) if older else None

    def series(self, window_s: float = 600.0) -> list[tuple[float, Rates]]:
        """(seconds before the newest sample, rates since the previous sample) for each pair
        of consecutive samples within `window_s`."""
        samples = list(self._samples)
        if len(samples) < 2:
            return []
        newest = samples[-1].at
        return [
            (new.at - newest, rates_between(old, new))
            for old, new in zip(samples, samples[1:], strict=False)
            if newest - new.at <= window_s
        ]
