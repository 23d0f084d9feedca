"""The deliverer: derives deliveries from the feed, claims due ones in SQL, POSTs them, and
records what came of each, in every process that runs it (`groupbuy serve`, `groupbuy
worker`), sharing the work through the claims.

Each endpoint has up to `max_in_flight` workers, tasks that attempt its claimed deliveries
one after another while any wait: a slow or dead endpoint holds only its own workers,
never the loop or another endpoint's. A worker hands each outcome to the next pass and
goes on with the next delivery; the pass records the outcomes together and claims what
follows.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import Counter, deque
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import cast

from groupbuy import metrics
from groupbuy.settings import WebhookSettings
from groupbuy.storage.db import Database
from groupbuy.storage.events import sequence_in
from groupbuy.webhooks import queue
from groupbuy.webhooks.outcomes import Completion, Outcome, complete_in, fail_unsendable
from groupbuy.webhooks.queue import Claimed, Target
from groupbuy.webhooks.recorder import Recorder
from groupbuy.webhooks.sender import Reply, Sender
from groupbuy.webhooks.signing import headers
from groupbuy.webhooks.store import secrets_in_use

log = logging.getLogger(__name__)

# A process claims up to this many times `max_in_flight` deliveries of an endpoint at once,
# and attempts `max_in_flight` of them at a time: the next ones are claimed while the
# current ones are in flight, so a fast endpoint is not held to one claim per round trip.
CLAIM_ROUNDS = 4
# An endpoint whose last attempts all succeeded is claimed for this many rounds, up to
# MAX_CLAIM deliveries. A pass waits its turn for SQLite's write lock behind the
# write-behind, then records and claims: long under a grab load. A delivery holds its
# place in the claim for about two passes (claimed in one, recorded in the next but one),
# while its attempt is short. So the claim, not the HTTP slots, set the rate while
# serving, and larger claims raised it (docs/benchmarks-findings.md). A failure brings
# the endpoint back to CLAIM_ROUNDS.
FAST_CLAIM_ROUNDS = 256
# The most deliveries one claim takes, whatever `max_in_flight`: a pass records and claims
# them while it holds SQLite's write lock (which a larger claim holds longer).
MAX_CLAIM = 2048
# A pass renews the process's claims once this share of a claim's length has passed since
# the last renewal: a renewal that fails or comes late still has the rest to succeed in.
RENEW_SHARE = 1 / 3
# At stop, how long the pass under way may take to end before it is cancelled.
PASS_END_S = 5.0
# Passes take at most about a share of the time: after a pass that lasted d seconds, the
# next one starts no sooner than PASS_SPACING times d after the last one began (at most
# MAX_GAP_S), whatever woke it. A pass costs the loop's CPU whatever it carries
# (docs/benchmarks-findings.md). Woken by each commit of the write-behind and each attempt
# that ended, passes came dozens of times a second while a backlog drained under load.
# On an idle loop a pass lasts a few ms, so the gap adds that much to the lag; on a busy
# one it lasts tens of ms, and the outcomes and new events of the gap share one pass.
PASS_SPACING = 4
MAX_GAP_S = 0.1
# Except when an endpoint's claimed deliveries not yet ended fall under this many rounds
# of `max_in_flight`: then its workers would soon stand idle, and the pass comes at once.
LOW_ROUNDS = 2


def wall_clock_ms() -> int:
    """The process's clock in epoch milliseconds (production's; tests pass their own)."""
    return time.time_ns() // 1_000_000


class Deliverer:
    """Runs deliveries for every endpoint; `clock` gives epoch milliseconds."""

    def __init__(
        self,
        database: Database,
        settings: WebhookSettings,
        sender: Sender,
        clock: Callable[[], int] = wall_clock_ms,
    ) -> None:
        self._db = database
        self._settings = settings
        self.sender = sender
        self._clock = clock
        # One process works an endpoint at a time (queue.claim): its claims, this process's.
        self._owner = queue.new_owner()
        # Endpoints whose last recorded attempts all succeeded (claimed in larger batches).
        self._fast: set[str] = set()
        self._disable_after_ms = settings.disable_after_s * 1000
        # A claim lasts one attempt's timeout plus the margin, renewed while held: a killed
        # process's deliveries wait that long, however many rounds it had claimed.
        self.claim_ms = round((settings.timeout_s + settings.claim_margin_s) * 1000)
        self._held: dict[int, Claimed] = {}
        self._renewed_ms: int | None = None
        # Passes come at least this often: the poll interval, or sooner when claims need
        # renewing sooner than that.
        self._pause_s = min(settings.poll_interval_s, self.claim_ms * RENEW_SHARE / 1000)
        # Per endpoint: the claimed deliveries no worker has taken yet, in claim order (with
        # the endpoint as the claiming pass read it), the workers, and how many claimed
        # deliveries have not had their outcome recorded yet.
        self._waiting: dict[str, deque[tuple[Target, Claimed]]] = {}
        self._workers: dict[str, set[asyncio.Task[None]]] = {}
        self._unended: Counter[str] = Counter()
        # Without the background loop (tests driving passes, the stop), outcomes are
        # recorded in batches of their own.
        self._recorder = Recorder(self._complete)
        # Outcomes waiting for the next pass to record them (while the loop runs).
        self._ended: list[tuple[Target, Outcome]] = []
        # Claims of an endpoint that was disabled before its workers took them, for the
        # next pass to give back.
        self._returning: list[Claimed] = []
        # Passes and outcome batches each keep a connection: no checkout (and its ping) for
        # each of their several transactions a second.
        self._pass_connection = database.held()
        self._record_connection = database.held()
        # What ends the pause between passes: `_stir` is set for each reason; `_soon` says
        # a pass is wanted once the gap after the last one has passed (new events, an
        # admin change, an attempt that ended), `_urgent` one wanted now (a claim running
        # low, the stop).
        self._stir = asyncio.Event()
        self._soon = False
        self._urgent = False
        # Passes the background loop has ended (tests wait for one to know it is idle).
        self.passes = 0
        self._loop: asyncio.Task[None] | None = None
        self._stopping = False

    async def tick(self) -> int:
        """One pass, one transaction: position the feed's new events, read the endpoints
        (their rows held to the commit), derive their new deliveries, renew the claims held
        when due, then claim what is due for every enabled endpoint with a free round of
        room, and queue those for its workers; returns how many it claimed. A pass with
        nothing of that to do is one read (_work_waits)."""
        now = self._clock()
        renewing = self._renewal_due(now)
        token = queue.new_token(self._owner)
        sqlite = self._db.is_sqlite
        if (
            not self._ended
            and not self._returning
            and not renewing
            and not await self._work_waits(now)
        ):
            return 0
        ended, self._ended = self._ended, []
        returning, self._returning = self._returning, []
        outcomes = [outcome for _, outcome in ended]
        try:
            async with self._pass_connection.transaction() as session:
                # The endpoints' rows first (the lock order of every pass), then what
                # changes them: outcomes may disable an endpoint, which then claims nothing.
                await sequence_in(session, sqlite)
                targets, top = await queue.read_targets(session, sqlite)
                completions = await complete_in(session, outcomes, self._disable_after_ms)
                await queue.release_in(session, returning)
                targets = _without_disabled(targets, outcomes, completions)
                await queue.derive_in(session, targets, top, now)
                if renewing:
                    await queue.renew_in(session, renewing, now + self.claim_ms)
                # The attempts recorded here free their room now.
                ending = Counter(o.claimed.endpoint_id for o in outcomes)
                wanted = {t.endpoint_id: self._wanted(t.endpoint_id, ending) for t in targets}
                claims = await queue.claim_in(session, targets, wanted, now, self.claim_ms, token)
        except BaseException as error:
            self._returning = returning + self._returning  # the next pass tries again
            if ended and isinstance(error, Exception) and not self._db.reachability.failed(error):
                # Something in one outcome, not SQL being away: record each apart, so that
                # it cannot hold back every endpoint's outcomes and claims pass after pass.
                await self._record_apart(ended, error)
                self._urgent = True  # the derive and claims this pass lost, at once
                return 0
            self._unrecorded([(endpoint, o.claimed) for endpoint, o in ended], error)
            raise
        for (endpoint, outcome), completion in zip(ended, completions, strict=True):
            self._recorded(endpoint, outcome, completion)
        if renewing is not None:
            self._renewed_ms = now
        by_id = {t.endpoint_id: t for t in targets}
        for claimed in claims:
            self._start(by_id[claimed.endpoint_id], claimed)
        return len(claims)

    async def _work_waits(self, now: int) -> bool:
        """Whether the pass has SQL work beside outcomes and renewals: one read, outside the
        pass's transaction, so an idle pass takes no lock (SQLite's write lock included)."""
        async with self._pass_connection.reading() as session:
            return await queue.work_waits(session, now)

    def _renewal_due(self, now: int) -> list[Claimed] | None:
        """The claims held, once a share of a claim's length has passed since the last
        renewal (None before that)."""
        if self._renewed_ms is not None and now - self._renewed_ms < self.claim_ms * RENEW_SHARE:
            return None
        return list(self._held.values())

    async def _record_apart(self, ended: list[tuple[Target, Outcome]], error: Exception) -> None:
        """Record outcomes one transaction each, after the pass that held them failed with
        `error`. An outcome that cannot be recorded as it came is recorded as an error of
        its own delivery (retried on the schedule), never held against the others."""
        log.warning(
            "webhook pass failed (%s): recording its %d outcomes one by one",
            type(error).__name__,
            len(ended),
        )
        for endpoint, outcome in ended:
            try:
                outcome, completion = await self._record_alone(outcome)
            except Exception as lost:
                self._unrecorded([(endpoint, outcome.claimed)], lost)
                continue
            self._recorded(endpoint, outcome, completion)

    async def _record_alone(self, outcome: Outcome) -> tuple[Outcome, Completion]:
        """Record one outcome in a transaction of its own; one that cannot be recorded as it
        came (while SQL answers) is recorded as an error of its delivery instead."""
        try:
            [completion] = await self._complete([outcome])
        except Exception as error:
            if self._db.reachability.failed(error):
                raise
            outcome = _unrecordable(outcome, error)
            [completion] = await self._complete([outcome])
        return outcome, completion

    def _wanted(self, endpoint_id: str, ending: Counter[str]) -> int:
        """How many of the endpoint's deliveries this process may hold after the next claim:
        its claim rounds' worth, or none until a round's worth of room is free (fewer,
        larger claims); `ending` counts the attempts whose outcomes the pass records."""
        held = self._unended[endpoint_id] - ending[endpoint_id]
        # max_in_flight is at most 256 (settings), so a round always fits in MAX_CLAIM.
        batch = min(self.claim_rounds(endpoint_id) * self._settings.max_in_flight, MAX_CLAIM)
        return batch if batch - held >= self._settings.max_in_flight else 0

    def claim_rounds(self, endpoint_id: str) -> int:
        """Rounds of `max_in_flight` attempts the next claim of the endpoint covers."""
        return FAST_CLAIM_ROUNDS if endpoint_id in self._fast else CLAIM_ROUNDS

    async def _complete(self, outcomes: list[Outcome]) -> list[Completion]:
        """Record a batch of outcomes in a transaction of its own (no pass records them)."""
        async with self._record_connection.transaction() as session:
            return await complete_in(session, outcomes, self._disable_after_ms)

    def _start(self, endpoint: Target, claimed: Claimed) -> None:
        """Queue a claimed delivery for the endpoint's workers, starting one if fewer than
        `max_in_flight` run."""
        endpoint_id = endpoint.endpoint_id
        self._held[claimed.delivery_id] = claimed
        self._unended[endpoint_id] += 1
        self._waiting.setdefault(endpoint_id, deque()).append((endpoint, claimed))
        workers = self._workers.setdefault(endpoint_id, set())
        if len(workers) < self._settings.max_in_flight:
            worker = asyncio.create_task(self._work(endpoint_id, workers))
            workers.add(worker)
            worker.add_done_callback(workers.discard)  # also when cancelled before it ran

    async def _work(self, endpoint_id: str, workers: set[asyncio.Task[None]]) -> None:
        """Attempt the endpoint's waiting deliveries one after another until none wait (or
        the deliverer stops: stop gives back those not taken)."""
        waiting = self._waiting[endpoint_id]
        try:
            while waiting and not self._stopping:
                endpoint, claimed = waiting.popleft()
                await self._attempt(endpoint, claimed)
        finally:
            # At once, not in a done callback: a delivery queued from now on must find the
            # room for a new worker.
            workers.discard(cast(asyncio.Task[None], asyncio.current_task()))

    async def _attempt(self, endpoint: Target, claimed: Claimed) -> None:
        try:
            reply = await self._send(endpoint, claimed)
            if reply is None:  # failed at once, recorded
                self._forget(claimed)
                return
            outcome = Outcome(claimed, reply, self._clock())
            if self._loop is not None and not self._stopping:
                # The next pass records it; this worker goes on with the next delivery.
                self._ended.append((endpoint, outcome))
                self._attempt_ended(endpoint.endpoint_id)
                return
            completion = await self._recorder.record(outcome)
        except asyncio.CancelledError:
            self._forget(claimed)
            raise
        except Exception as error:
            self._unrecorded([(endpoint, claimed)], error)
            return
        self._recorded(endpoint, outcome, completion)

    def _recorded(self, endpoint: Target, outcome: Outcome, completion: Completion) -> None:
        """What follows an attempt's recorded outcome: the endpoint's claim size, the
        metrics, a line when it disabled the endpoint; the claim is no longer held."""
        self._forget(outcome.claimed)
        reply = outcome.reply
        if reply.succeeded:
            self._fast.add(endpoint.endpoint_id)
        else:
            self._fast.discard(endpoint.endpoint_id)
        metrics.WEBHOOK_DELIVERIES.labels(endpoint.endpoint_id, _outcome(reply, completion)).inc()
        if completion.disabled:
            log.warning(
                "webhook endpoint %s disabled (%s): its deliveries wait until it is enabled",
                endpoint.endpoint_id,
                completion.disabled,
            )
            # What its workers have not taken yet is not sent: given back by the next pass.
            self._returning += self._untaken(endpoint.endpoint_id)

    def _untaken(self, endpoint_id: str) -> list[Claimed]:
        """Take the endpoint's claimed deliveries no worker has started out of its queue
        (the caller gives them back)."""
        waiting = self._waiting.get(endpoint_id, deque())
        taken = [claimed for _, claimed in waiting]
        waiting.clear()
        for claimed in taken:
            self._forget(claimed)
        return taken

    def _unrecorded(self, attempts: Sequence[tuple[Target, Claimed]], error: BaseException) -> None:
        """Attempts whose outcomes could not be recorded: their claims are let go, so they
        expire and another pass (here or in another process) tries again."""
        for endpoint, claimed in attempts:
            self._forget(claimed)
            if not isinstance(error, asyncio.CancelledError):
                log.warning(
                    "webhook delivery %s to %s could not be recorded: %s",
                    claimed.webhook_id,
                    endpoint.endpoint_id,
                    type(error).__name__,
                )

    def _forget(self, claimed: Claimed) -> None:
        """The claim is not held any more: not renewed, not counted as the endpoint's."""
        if self._held.get(claimed.delivery_id) is claimed:
            del self._held[claimed.delivery_id]
        self._unended[claimed.endpoint_id] -= 1

    async def _send(self, endpoint: Target, claimed: Claimed) -> Reply | None:
        """POST the delivery, signed now; None when its body is over the bound (then it has
        failed at once, with the reason)."""
        if len(claimed.body) > self._settings.max_payload_bytes:
            reason = f"payload_too_large: {len(claimed.body)} bytes"
            await fail_unsendable(self._db, claimed, reason, self._clock())
            metrics.WEBHOOK_DELIVERIES.labels(endpoint.endpoint_id, "failed").inc()
            return None
        sent_at = self._clock()
        signed = headers(
            secrets_in_use(endpoint, sent_at), claimed.webhook_id, sent_at // 1000, claimed.body
        )
        reply = await self.sender.post(endpoint.endpoint_id, endpoint.url, claimed.body, signed)
        metrics.WEBHOOK_ATTEMPT_SECONDS.labels(endpoint.endpoint_id).observe(
            reply.duration_ms / 1000
        )
        return reply

    def wake(self) -> None:
        """Start a pass soon (once the gap after the last one has passed) rather than at
        the next poll: new work was queued."""
        self._soon = True
        self._stir.set()

    def _attempt_ended(self, endpoint_id: str) -> None:
        """Have the next pass come soon, or now when few of the endpoint's claimed
        deliveries are left for its workers."""
        left = len(self._waiting.get(endpoint_id, ()))
        if left < LOW_ROUNDS * self._settings.max_in_flight:
            self._urgent = True
        self._soon = True
        self._stir.set()

    async def settle(self) -> None:
        """Wait until every claimed delivery has been attempted and its outcome recorded
        (tests, shutdown)."""
        while True:
            if workers := [t for group in self._workers.values() for t in group]:
                await asyncio.gather(*workers, return_exceptions=True)
            elif self._ended and self._loop is not None:
                self._urgent = True  # the pass that records them, now
                self._stir.set()
                await asyncio.sleep(0.01)
            else:
                return

    def start(self) -> None:
        """Run passes in the background: after each attempt ends, else every poll interval."""
        self._stopping = False
        self._loop = asyncio.create_task(self._run(), name="webhook-deliverer")

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while not self._stopping:
            began = loop.time()
            self._urgent = self._soon = False
            try:
                # Every pass looks for new events too: in one transaction with the claims,
                # that costs one probe, so an ended attempt's pass also derives.
                await self.tick()
            except Exception as error:  # SQL away: said by the database's reachability
                if not self._db.reachability.failed(error):
                    log.warning("webhook deliverer pass failed", exc_info=True)
            self.passes += 1
            gap = min(MAX_GAP_S, PASS_SPACING * (loop.time() - began))
            await self._pause(began + gap)

    async def _pause(self, not_before: float) -> None:
        """Wait for the next pass: until one is wanted now, one is wanted soon and the loop
        time is past `not_before`, or the poll interval has passed."""
        loop = asyncio.get_running_loop()
        polled = loop.time() + self._pause_s
        while not (self._urgent or self._stopping):
            until = polled
            if self._soon:
                until = min(until, not_before)
            left = until - loop.time()
            if left <= 0:
                return
            self._stir.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stir.wait(), left)
            if not self._stir.is_set():
                return  # the time was up

    async def _record_ended(self) -> None:
        """Record the outcomes no pass took (the loop has ended)."""
        ended, self._ended = self._ended, []
        if not ended:
            return
        try:
            completions = await self._complete([outcome for _, outcome in ended])
        except Exception as error:
            if self._db.reachability.failed(error):
                self._unrecorded([(endpoint, o.claimed) for endpoint, o in ended], error)
            else:
                await self._record_apart(ended, error)
            return
        for (endpoint, outcome), completion in zip(ended, completions, strict=True):
            self._recorded(endpoint, outcome, completion)

    async def stop(self) -> None:
        """Stop passing, let the attempts in flight end (their claims would otherwise wait
        out their time), then close the connections."""
        self._stopping = True
        self._stir.set()
        if self._loop is not None:
            # The pass under way ends first: cut short, its SQL call would answer later
            # into a loop that may be closed by then (the deliverer's own thread's).
            try:
                async with asyncio.timeout(PASS_END_S):
                    await asyncio.shield(self._loop)
            except TimeoutError:
                self._loop.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await self._loop
            self._loop = None
        await self._record_ended()
        # What no worker has taken is given back, due again at once for any process; the
        # workers end with the attempt each has under way.
        unattempted, self._returning = self._returning, []
        for endpoint_id in self._waiting:
            unattempted += self._untaken(endpoint_id)
        try:
            async with asyncio.timeout(self._settings.timeout_s + 1):
                await self.settle()
        except TimeoutError:
            for group in self._workers.values():
                for task in group:
                    task.cancel()
        await self._recorder.aclose()
        if unattempted:
            with contextlib.suppress(Exception):  # else their claims expire
                await queue.release(self._db, unattempted)
        await self._pass_connection.close()
        await self._record_connection.close()
        await self.sender.aclose()


def _without_disabled(
    targets: list[Target], outcomes: list[Outcome], completions: list[Completion]
) -> list[Target]:
    """The endpoints as read, those the recorded outcomes disabled marked so."""
    disabled = {
        o.claimed.endpoint_id for o, c in zip(outcomes, completions, strict=True) if c.disabled
    }
    return [replace(t, disabled=True) if t.endpoint_id in disabled else t for t in targets]


def _unrecordable(outcome: Outcome, error: Exception) -> Outcome:
    """The outcome as an error of its delivery: what the endpoint answered could not be
    recorded (the attempt row says why; the delivery is retried on the schedule)."""
    reply = Reply(
        None, f"unrecordable_answer: {type(error).__name__}", outcome.reply.duration_ms, b""
    )
    return replace(outcome, reply=reply)


def _outcome(reply: Reply, completion: Completion) -> str:
    """The outcome label of an attempt: delivered, retrying, failed, or gone (a 410)."""
    if reply.succeeded:
        return "delivered"
    if reply.status_code == 410:
        return "gone"
    return "failed" if completion.status == "failed" else "retrying"
