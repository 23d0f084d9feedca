"""Whether Redis answers, said once per change: one WARNING when it stops, one INFO when it
is back, instead of a chained traceback from every background loop every few seconds.
The database has one of its own (`Database.reachability`, judged by
`groupbuy.storage.db.unavailable`).

Each process has one `Reachability` (the composition root builds it); every place that
catches Redis failures in the background (the scheduler's lease and jobs, the outbox
flush, the start-up script load) and the API's error handler report to it. A failure that
is not Redis being unreachable is none of its business: the caller logs it, with its
traceback, as the bug it may be.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import redis.exceptions

log = logging.getLogger(__name__)

# What Redis being away raises (a refused or dropped connection, no answer in time, a
# server still loading its data; on a cluster, a shard without a primary, a slot nobody
# serves, redirections that never settle): each is retried, none is a bug of ours.
UNREACHABLE = (
    redis.exceptions.ConnectionError,
    redis.exceptions.TimeoutError,
    redis.exceptions.ClusterError,  # ClusterDownError, and "TTL exhausted" redirections
    redis.exceptions.TryAgainError,
    redis.exceptions.SlotNotCoveredError,
)


def unreachable(error: BaseException) -> bool:
    """Whether `error` means Redis is unreachable. A cluster client that reaches no node at
    all raises a bare RedisClusterException caused by the connection error."""
    if isinstance(error, UNREACHABLE):
        return True
    return isinstance(error, redis.exceptions.RedisClusterException) and isinstance(
        error.__cause__, UNREACHABLE
    )


def closed_transport(error: BaseException) -> bool:
    """Whether `error` is the RuntimeError a command meets when redis-py closed its
    connection under it (its cluster client closes every node's connections on
    CLUSTERDOWN, as in a primary's failover): uvloop's "unable to perform operation on
    <TCPTransport closed=True ...>; the handler is closed". A new connection serves the
    command again."""
    if not isinstance(error, RuntimeError):
        return False
    text = str(error)
    return "handler is closed" in text or "closed=True" in text


class Reachability:
    """The last known state of one Redis (or, with `what` and `judge`, of another backing
    service: the database), as this process saw it; logs each change once."""

    def __init__(
        self,
        where: str,
        what: str = "redis",
        judge: Callable[[BaseException], bool] = unreachable,
    ) -> None:
        self.where = where
        self.what = what
        self._judge = judge  # whether an error means the service is away
        self.down = False

    def failed(self, error: BaseException) -> bool:
        """Note a failed call; True when `error` means the service is unreachable (logged
        here, the first time only), False for any other error (the caller reports it)."""
        if not self._judge(error):
            return False
        if not self.down:
            self.down = True
            reason = str(error) or type(error).__name__
            log.warning("%s at %s unreachable: %s; retrying", self.what, self.where, reason)
        return True

    def answered(self) -> None:
        """Note a call the service answered (logs that it is back after a failure)."""
        if self.down:
            self.down = False
            log.info("%s at %s is back", self.what, self.where)
