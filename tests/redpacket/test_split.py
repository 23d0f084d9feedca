"""Tests of the red-packet split strategies (SPEC §1 item 2, §4 guarantees 3 and 7).

Property tests (hypothesis) check every split: `count` integer shares, each >= 1 cent,
summing to `amount`; double_mean keeps each share within twice the mean of what
remains; equal differs by at most one cent. Fairness is checked twice: exactly, by
enumerating every outcome of the random draws for small packets, and statistically,
by the per-position sample mean over many splits, a check that is itself shown to
reject deliberately biased variants. Randomness must come only from `randbelow`,
which defaults to `secrets`.
"""

from __future__ import annotations

import inspect
import math
import random
import secrets
from collections import defaultdict
from collections.abc import Callable, Iterator
from fractions import Fraction
from typing import get_args

import pytest
from groupbuy_client.wire import SplitStrategy
from hypothesis import given
from hypothesis import settings as hypothesis_settings
from hypothesis import strategies as st

from groupbuy.redpacket.split import SPLITS, STRATEGIES, RandomBelow, double_mean, equal, split

Splitter = Callable[[int, int, RandomBelow], list[int]]

MAX_COUNT = 10_000
MAX_AMOUNT = 1_000_000
PROPERTY_SETTINGS = hypothesis_settings(max_examples=200, deadline=None)

# A per-position mean farther than this many standard errors from amount/count is
# rejected: with about thirty positions checked, a fair splitter is wrongly rejected
# with probability ~1e-5, while the biased variants below sit 15+ errors away.
Z_LIMIT = 5.0
EPSILON = 1e-9


# -- helpers ------------------------------------------------------------------------


def seeded(seed: int) -> RandomBelow:
    """A deterministic randbelow: a seeded Random's randrange."""
    return random.Random(seed).randrange


class CheckedRandomBelow:
    """Wraps a randbelow: refuses bounds secrets.randbelow refuses and counts the calls."""

    def __init__(self, inner: RandomBelow) -> None:
        self.inner = inner
        self.calls = 0

    def __call__(self, n: int) -> int:
        assert type(n) is int and n >= 1, f"randbelow({n!r}) would raise in secrets"
        self.calls += 1
        value = self.inner(n)
        assert 0 <= value < n
        return value


def _lowest(n: int) -> int:
    return 0


def _highest(n: int) -> int:
    return n - 1


def _never(n: int) -> int:
    raise AssertionError("randbelow must not be called")


@st.composite
def amounts_and_counts(draw: st.DrawFn) -> tuple[int, int]:
    """1 <= count <= 10000 and count <= amount <= 1_000_000, often near the edges."""
    count = draw(st.one_of(st.integers(1, 30), st.integers(1, MAX_COUNT)))
    slack = draw(st.one_of(st.integers(0, 10), st.integers(0, MAX_AMOUNT - count)))
    return count + slack, count


# The source of randomness: a seeded generator, or the two extremes an adversarial
# (or broken) generator could return every time.
randbelows = st.one_of(
    st.integers(0, 2**32).map(seeded),
    st.sampled_from([_lowest, _highest]),
)


def _check_shares(shares: list[int], amount: int, count: int) -> None:
    assert len(shares) == count
    assert all(type(share) is int for share in shares)
    assert all(share >= 1 for share in shares), min(shares)
    assert sum(shares) == amount


# -- properties of every split -------------------------------------------------------


@pytest.mark.parametrize("strategy", STRATEGIES)
@PROPERTY_SETTINGS
@given(case=amounts_and_counts(), source=randbelows)
def test_shares_are_count_positive_ints_summing_to_amount(
    strategy: str, case: tuple[int, int], source: RandomBelow
) -> None:
    amount, count = case
    randbelow = CheckedRandomBelow(source)
    _check_shares(split(strategy, amount, count, randbelow), amount, count)


@PROPERTY_SETTINGS
@given(case=amounts_and_counts(), source=randbelows)
def test_double_mean_share_is_at_most_twice_the_remaining_mean(
    case: tuple[int, int], source: RandomBelow
) -> None:
    amount, count = case
    shares = double_mean(amount, count, CheckedRandomBelow(source))
    _check_shares(shares, amount, count)
    remaining = amount
    for i, share in enumerate(shares[:-1]):
        left = count - i
        # share <= 2 * remaining / left, in integers
        assert share * left <= 2 * remaining, (i, share, remaining, left)
        remaining -= share
    assert shares[-1] == remaining


@PROPERTY_SETTINGS
@given(case=amounts_and_counts(), source=randbelows)
def test_equal_shares_differ_by_at_most_one_cent(
    case: tuple[int, int], source: RandomBelow
) -> None:
    amount, count = case
    shares = equal(amount, count, CheckedRandomBelow(source))
    _check_shares(shares, amount, count)
    base = amount // count
    assert max(shares) - min(shares) <= 1
    assert set(shares) <= {base, base + 1}
    assert shares.count(base + 1) == amount % count


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_extreme_randbelow_answers_still_leave_a_cent_for_everyone(strategy: str) -> None:
    for source in (_lowest, _highest):
        for amount, count in [(2, 2), (3, 2), (7, 3), (10_000, MAX_COUNT), (MAX_AMOUNT, 2)]:
            _check_shares(split(strategy, amount, count, source), amount, count)
    assert double_mean(100, 5, _lowest) == [1, 1, 1, 1, 96]
    # n - 1 never rounds the bound up, so each share is floor((2r - n) / n): 195 // 5, ...
    assert double_mean(100, 5, _highest) == [39, 29, 20, 11, 1]


# -- where the randomness comes from -------------------------------------------------


@pytest.mark.parametrize("strategy", STRATEGIES)
# amount % count != 0, or equal's shares would not depend on the draws at all
@pytest.mark.parametrize(("amount", "count"), [(101, 5), (999_950, 100), (995_000, MAX_COUNT)])
def test_same_randbelow_seed_gives_the_same_shares(strategy: str, amount: int, count: int) -> None:
    first = split(strategy, amount, count, seeded(1234))
    assert split(strategy, amount, count, seeded(1234)) == first
    # ... and the seed matters: the shares are drawn from randbelow, not fixed.
    assert any(split(strategy, amount, count, seeded(seed)) != first for seed in range(5))


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_every_draw_goes_through_the_randbelow_argument(
    strategy: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # With a randbelow passed in, the system generator behind `secrets` is never touched.
    def refuse(self: random.SystemRandom, k: int) -> int:
        raise AssertionError("secrets was used although a randbelow was passed")

    monkeypatch.setattr(random.SystemRandom, "getrandbits", refuse)
    randbelow = CheckedRandomBelow(seeded(7))
    shares = split(strategy, 1000, 10, randbelow)
    _check_shares(shares, 1000, 10)
    assert randbelow.calls >= 9


@pytest.mark.parametrize("function", [double_mean, equal, split])
def test_default_randbelow_is_secrets(function: Callable[..., list[int]]) -> None:
    default = inspect.signature(function).parameters["randbelow"].default
    assert default is secrets.randbelow


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_default_draws_from_the_system_generator(
    strategy: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The default argument was bound when split.py was imported, so patching
    # secrets.randbelow now would not reach it; instead spy one level down, on the
    # SystemRandom (os.urandom) generator that secrets.randbelow draws from.
    calls = 0
    real_getrandbits = random.SystemRandom.getrandbits

    def spy(self: random.SystemRandom, k: int) -> int:
        nonlocal calls
        calls += 1
        return real_getrandbits(self, k)

    monkeypatch.setattr(random.SystemRandom, "getrandbits", spy)
    amount, count = 999_950, 100  # 50 extra cents, so equal's placement is random too
    shares = split(strategy, amount, count)
    _check_shares(shares, amount, count)
    assert calls >= count - 1
    # Unpredictable: two packets essentially never repeat (the chance is below 1e-28).
    assert split(strategy, amount, count) != shares


# -- invalid input -------------------------------------------------------------------


@pytest.mark.parametrize("strategy", STRATEGIES)
@pytest.mark.parametrize(
    ("amount", "count"),
    [(10, 0), (10, -1), (0, 0), (4, 5), (0, 1), (-5, 1), (9_999, MAX_COUNT)],
)
def test_impossible_splits_raise_value_error(strategy: str, amount: int, count: int) -> None:
    function = SPLITS[strategy]
    with pytest.raises(ValueError, match="cannot split"):
        function(amount, count, _never)
    with pytest.raises(ValueError, match="cannot split"):
        split(strategy, amount, count, _never)


@pytest.mark.parametrize("strategy", ["", "random", "DOUBLE_MEAN", "equal ", "double-mean"])
def test_unknown_strategy_raises_value_error(strategy: str) -> None:
    with pytest.raises(ValueError, match="unknown split strategy"):
        split(strategy, 100, 5, _never)


# -- extremes ------------------------------------------------------------------------


@pytest.mark.parametrize("strategy", STRATEGIES)
@pytest.mark.parametrize("count", [1, 2, 3, 1000, MAX_COUNT])
def test_amount_equal_to_count_gives_all_ones(strategy: str, count: int) -> None:
    assert split(strategy, count, count, seeded(count)) == [1] * count
    assert split(strategy, count, count) == [1] * count


@pytest.mark.parametrize("strategy", STRATEGIES)
@pytest.mark.parametrize("amount", [1, 2, 99, MAX_AMOUNT])
def test_single_share_takes_the_whole_amount(strategy: str, amount: int) -> None:
    assert split(strategy, amount, 1, seeded(amount)) == [amount]
    assert split(strategy, amount, 1) == [amount]


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_largest_packet(strategy: str) -> None:
    for randbelow in (seeded(42), secrets.randbelow, _lowest, _highest):
        shares = split(strategy, MAX_AMOUNT, MAX_COUNT, randbelow)
        _check_shares(shares, MAX_AMOUNT, MAX_COUNT)
    assert equal(MAX_AMOUNT, MAX_COUNT, seeded(42)) == [100] * MAX_COUNT


# -- exact fairness, by enumerating every outcome of the draws ----------------------


class _Branch(Exception):
    """Raised by the replaying randbelow when it reaches a draw not yet decided."""

    def __init__(self, n: int) -> None:
        self.n = n


class _Replay:
    """A randbelow that answers a fixed list of choices, then raises _Branch."""

    def __init__(self, choices: tuple[int, ...]) -> None:
        self.choices = choices
        self.used = 0

    def __call__(self, n: int) -> int:
        assert n >= 1
        if self.used == len(self.choices):
            raise _Branch(n)
        self.used += 1
        return self.choices[self.used - 1]


def _outcomes(splitter: Splitter, amount: int, count: int) -> Iterator[tuple[Fraction, list[int]]]:
    """Every possible split with its exact probability, by depth-first replay of the draws."""
    pending: list[tuple[tuple[int, ...], Fraction]] = [((), Fraction(1))]
    while pending:
        choices, probability = pending.pop()
        replay = _Replay(choices)
        try:
            shares = splitter(amount, count, replay)
        except _Branch as branch:
            for k in range(branch.n):
                pending.append(((*choices, k), probability / branch.n))
            continue
        assert replay.used == len(choices)
        yield probability, shares


def _exact_position_means(splitter: Splitter, amount: int, count: int) -> list[Fraction]:
    means = [Fraction(0)] * count
    total = Fraction(0)
    for probability, shares in _outcomes(splitter, amount, count):
        _check_shares(shares, amount, count)
        total += probability
        means = [mean + probability * share for mean, share in zip(means, shares, strict=True)]
    assert total == 1
    return means


SMALL_CASES = [(1, 1), (5, 1), (2, 2), (3, 2), (9, 2), (7, 3), (10, 3), (12, 4), (9, 5)]


@pytest.mark.parametrize("strategy", STRATEGIES)
@pytest.mark.parametrize(("amount", "count"), SMALL_CASES)
def test_every_position_expects_amount_over_count_exactly(
    strategy: str, amount: int, count: int
) -> None:
    splitter = SPLITS[strategy]
    assert _exact_position_means(splitter, amount, count) == [Fraction(amount, count)] * count


@pytest.mark.parametrize(("amount", "count"), [(7, 3), (10, 4), (11, 5)])
def test_equal_places_the_extra_cents_uniformly(amount: int, count: int) -> None:
    arrangements: defaultdict[tuple[int, ...], Fraction] = defaultdict(Fraction)
    for probability, shares in _outcomes(equal, amount, count):
        arrangements[tuple(shares)] += probability
    extra = amount % count
    assert len(arrangements) == math.comb(count, extra)
    assert set(arrangements.values()) == {Fraction(1, math.comb(count, extra))}


# -- deliberately biased splitters: the fairness checks must reject them ---------------


def biased_floor_of_twice_mean(amount: int, count: int, randbelow: RandomBelow) -> list[int]:
    """Uniform in [1, floor(2 x mean)], capped to leave 1 cent each: too generous early."""
    shares = []
    remaining = amount
    for left in range(count, 1, -1):
        share = 1 + randbelow(min(2 * remaining // left, remaining - (left - 1)))
        shares.append(share)
        remaining -= share
    shares.append(remaining)
    return shares


def biased_without_rounding(amount: int, count: int, randbelow: RandomBelow) -> list[int]:
    """Uniform in [1, floor(2 x mean - 1)], the fraction dropped: too stingy early."""
    shares = []
    remaining = amount
    for left in range(count, 1, -1):
        share = 1 + randbelow((2 * remaining - left) // left)
        shares.append(share)
        remaining -= share
    shares.append(remaining)
    return shares


BIASED = [biased_floor_of_twice_mean, biased_without_rounding]


@pytest.mark.parametrize("splitter", BIASED)
def test_exact_enumeration_rejects_biased_splitters(splitter: Splitter) -> None:
    for amount, count in [(10, 3), (7, 3)]:
        for probability, shares in _outcomes(splitter, amount, count):
            _check_shares(shares, amount, count)  # valid splits, only unfair
            assert probability > 0
        means = _exact_position_means(splitter, amount, count)
        assert means != [Fraction(amount, count)] * count


# -- statistical fairness (SPEC §4.7) -------------------------------------------------


def unfair_positions(
    splitter: Splitter, amount: int, count: int, samples: int, randbelow: RandomBelow
) -> list[str]:
    """The grab positions whose sample mean is over Z_LIMIT standard errors from amount/count."""
    sums = [0] * count
    squares = [0] * count
    for _ in range(samples):
        shares = splitter(amount, count, randbelow)
        assert len(shares) == count and sum(shares) == amount
        for position, share in enumerate(shares):
            sums[position] += share
            squares[position] += share * share
    expected = amount / count
    unfair = []
    for position in range(count):
        mean = sums[position] / samples
        # sample variance, from exact integer sums
        variance = (samples * squares[position] - sums[position] ** 2) / (samples * (samples - 1))
        stderr = math.sqrt(variance / samples)
        if abs(mean - expected) > Z_LIMIT * stderr + EPSILON:
            unfair.append(
                f"position {position}: mean {mean:.4f}, expected {expected:.4f}, "
                f"{abs(mean - expected) / stderr if stderr else math.inf:.1f} standard errors"
            )
    return unfair


FAIRNESS_CASES = [
    (100, 5, 40_000),
    (1000, 10, 20_000),
    (7, 3, 40_000),
    (10, 3, 40_000),
    (MAX_AMOUNT, 7, 20_000),
]


@pytest.mark.parametrize("strategy", STRATEGIES)
@pytest.mark.parametrize(("amount", "count", "samples"), FAIRNESS_CASES)
def test_every_grab_position_is_fair_on_average(
    strategy: str, amount: int, count: int, samples: int
) -> None:
    splitter = SPLITS[strategy]
    seed = amount * 100_003 + count
    assert unfair_positions(splitter, amount, count, samples, seeded(seed)) == []


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_every_grab_position_is_fair_with_secrets(strategy: str) -> None:
    splitter = SPLITS[strategy]
    assert unfair_positions(splitter, 100, 5, 10_000, secrets.randbelow) == []


@pytest.mark.parametrize("splitter", BIASED)
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_fairness_check_rejects_a_biased_splitter(splitter: Splitter, seed: int) -> None:
    unfair = unfair_positions(splitter, 10, 3, 40_000, seeded(seed))
    assert unfair, "the fairness check accepted a biased splitter"


def test_the_wire_names_every_strategy_and_no_other() -> None:
    """A new strategy is a function and a line in SPLITS, and its name in wire.SplitStrategy:
    the API, the OpenAPI document and the typed client take it from there."""
    assert get_args(SplitStrategy) == STRATEGIES
