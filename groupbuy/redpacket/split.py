"""How a packet's amount is split into its shares, drawn with `secrets` (never Lua's math.random).

Shares are drawn once, at send time, and queued in Redis; each grab takes the next one.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable

RandomBelow = Callable[[int], int]
"""randbelow(n): a uniform integer in [0, n); `secrets.randbelow` unless a test passes one."""


def double_mean(amount: int, count: int, randbelow: RandomBelow = secrets.randbelow) -> list[int]:
    """Each share uniform in [1, 2 x mean of what remains - 1], the last takes the rest.

    The upper bound 2r/n - 1 is rarely an integer; it is rounded up with probability equal
    to its fraction, so each share's expectation is exactly r/n. By induction every grab
    position then expects amount/count. The bound never exceeds r - (n - 1): every later
    grab keeps at least 1 cent.
    """
    _check(amount, count)
    shares = []
    remaining = amount
    for left in range(count, 1, -1):
        # upper = (2r - n) / n, as integer part and remainder out of n
        whole, fraction = divmod(2 * remaining - left, left)
        upper = whole + (1 if randbelow(left) < fraction else 0)
        share = 1 + randbelow(upper)
        shares.append(share)
        remaining -= share
    shares.append(remaining)
    return shares


def equal(amount: int, count: int, randbelow: RandomBelow = secrets.randbelow) -> list[int]:
    """Every share amount // count; the cents left over go one each to randomly placed shares."""
    _check(amount, count)
    base, extra = divmod(amount, count)
    shares = [base + 1] * extra + [base] * (count - extra)
    for i in range(count - 1, 0, -1):  # Fisher-Yates, so nobody can aim for a bigger share
        j = randbelow(i + 1)
        shares[i], shares[j] = shares[j], shares[i]
    return shares


Split = Callable[[int, int, RandomBelow], list[int]]
"""A strategy: (amount, count, randbelow) -> the shares, in grab order."""

# Every strategy by its name (groupbuy_client.wire.SplitStrategy lists the same names): a new one
# is a function above and a line here.
SPLITS: dict[str, Split] = {"double_mean": double_mean, "equal": equal}
STRATEGIES = tuple(SPLITS)


def split(
    strategy: str, amount: int, count: int, randbelow: RandomBelow = secrets.randbelow
) -> list[int]:
    """The shares of a packet under a named strategy."""
    chosen = SPLITS.get(strategy)
    if chosen is None:
        raise ValueError(f"unknown split strategy {strategy!r}")
    return chosen(amount, count, randbelow)


def _check(amount: int, count: int) -> None:
    if count < 1 or amount < count:
        raise ValueError(f"cannot split {amount} cents into {count} shares of at least 1 cent")
