"""The deliverer: derives deliveries from the feed, claims due ones in SQL, POSTs them, and
records what came of each, in every process that runs it (`groupbuy serve`, `groupbuy
worker`), sharing the work through the claims.

Each endpoint's attempts run as tasks of their own, at most `max_in_flight` at once: a
slow or dead endpoint holds only its own slots, never the loop or another endpoint's.
A finished attempt wakes the loop, so a fast endpoint's next deliveries go at once rather
than at the next poll.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import replace

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
# write-behind, then records and claims: 150-950 ms under a grab load. A delivery holds
# its place in the claim for about two passes (claimed in one, recorded in the next but
# one), while its attempt takes 2-4 ms. So the claim, not the HTTP slots, set the rate
# while serving: 150-310 events/s with 16 rounds, 725-1,191 with 128, 982-1,491 with 256
# (docs/benchmarks-findings.md). A failure brings the endpoint back to CLAIM_ROUNDS.
FAST_CLAIM_ROUNDS = 256
# The most deliveries one claim takes, whatever `max_in_flight`: a pass records and claims
# them while it holds SQLite's write lock (up to ~1 s under load at this size).
MAX_CLAIM = 2048
# A pass renews the process's claims once this share of a claim's length has passed since
# the last renewal: a renewal that fails or comes late still has the rest to succeed in.
RENEW_SHARE = 1 / 3
# At stop, how long the pass under way may take to end before it is cancelled.
PASS_END_S = 5.0
# Passes take at most about a share of the time: after a pass that lasted d seconds, the
# next one starts no sooner than PASS_SPACING times d after the last one began (at most
# MAX_GAP_S), whatever woke it. A pass costs 3-6 ms of the loop's CPU whatever it
# carries (docs/benchmarks-findings.md); woken by each commit of the write-behind and each
# attempt that ended, passes came 55 times a second while a backlog drained under load.
# On an idle loop a pass lasts a few ms, so the gap adds that much to the lag; on a busy
# one it lasts tens of ms, and the outcomes and new events of the gap share one pass.
PASS_SPACING = 4
MAX_GAP_S = 0.1
# Except when an endpoint's claimed deliveries not yet ended fall under this many rounds
# of `max_in_flight`: then its slots would soon stand idle, and the pass comes at once.
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
        self._slots: dict[str, asyncio.Semaphore] = {}
        self._unattempted: list[Claimed] = []
        self._disable_after_ms = settings.disable_after_s * 1000
        # A claim lasts one attempt's timeout plus the margin, renewed while held: a killed
        # process's deliveries wait that long, however many rounds it had claimed.
        self.claim_ms = round((settings.timeout_s + settings.claim_margin_s) * 1000)
        self._held: dict[int, Claimed] = {}
        self._renewed_ms: int | None = None
        # Passes come at least this often: the poll interval, or sooner when claims need
        # renewing sooner than that.
        self._pause_s = min(settings.poll_interval_s, self.claim_ms * RENEW_SHARE / 1000)
        self._in_flight: dict[str, set[asyncio.Task[None]]] = {}
        self._recorder = Recorder(self._complete)
        # Outcome batches waiting for the next pass to record them (while the loop runs).
        self._ended: list[tuple[list[Outcome], asyncio.Future[list[Completion]]]] = []
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
        slots, and start those attempts; returns how many it started."""
        now = self._clock()
        renewing = self._renewal_due(now)
        token = queue.new_token(self._owner)
        sqlite = self._db.is_sqlite
        if not self._ended and not renewing and not await self._work_waits(now):
            return 0
        ended, self._ended = self._ended, []
        outcomes = [outcome for batch, _ in ended for outcome in batch]
        try:
            async with self._pass_connection.transaction() as session:
                # The endpoints' rows first (the lock order of every pass), then what
                # changes them: outcomes may disable an endpoint, which then claims nothing.
                await sequence_in(session, sqlite)
                targets, top = await queue.read_targets(session, sqlite)
                completions = await complete_in(session, outcomes, self._disable_after_ms)
                targets = _without_disabled(targets, outcomes, completions)
                await queue.derive_in(session, targets, top, now)
                if renewing:
                    await queue.renew_in(session, renewing, now + self.claim_ms)
                # The attempts recorded here free their room now, before their tasks end.
                ending = Counter(o.claimed.endpoint_id for o in outcomes)
                wanted = {t.endpoint_id: self._wanted(t.endpoint_id, ending) for t in targets}
                claims = await queue.claim_in(session, targets, wanted, now, self.claim_ms, token)
        except BaseException as error:
            for _, future in ended:
                if future.done():
                    continue
                if isinstance(error, asyncio.CancelledError):
                    future.cancel()
                else:
                    future.set_exception(error)
            raise
        for batch, future in ended:
            if not future.done():
                future.set_result(completions[: len(batch)])
            completions = completions[len(batch) :]
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

    def _wanted(self, endpoint_id: str, ending: Counter[str]) -> int:
        """How many of the endpoint's deliveries this process may hold after the next claim:
        its claim rounds' worth, or none until a round's worth of room is free (fewer,
        larger claims); `ending` counts the attempts whose outcomes the pass records."""
        held = len(self._in_flight.get(endpoint_id, ())) - ending[endpoint_id]
        # max_in_flight is at most 256 (settings), so a round always fits in MAX_CLAIM.
        batch = min(self.claim_rounds(endpoint_id) * self._settings.max_in_flight, MAX_CLAIM)
        return batch if batch - held >= self._settings.max_in_flight else 0

    def claim_rounds(self, endpoint_id: str) -> int:
        """Rounds of `max_in_flight` attempts the next claim of the endpoint covers."""
        return FAST_CLAIM_ROUNDS if endpoint_id in self._fast else CLAIM_ROUNDS

    async def _complete(self, outcomes: list[Outcome]) -> list[Completion]:
        """Record a batch of outcomes: in the next pass's transaction while the background
        loop runs (one transaction records them and claims what follows), else in one
        of its own (tests driving passes by hand, shutdown)."""
        if not outcomes:
            return []
        if self._loop is None or self._stopping:
            async with self._record_connection.transaction() as session:
                return await complete_in(session, outcomes, self._disable_after_ms)
        future: asyncio.Future[list[Completion]] = asyncio.get_running_loop().create_future()
        self._ended.append((outcomes, future))
        self._attempt_ended(outcomes[0].claimed.endpoint_id)
        return await future

    def _start(self, endpoint: Target, claimed: Claimed) -> None:
        task = asyncio.create_task(self._attempt(endpoint, claimed))
        tasks = self._in_flight.setdefault(endpoint.endpoint_id, set())
        tasks.add(task)
        self._held[claimed.delivery_id] = claimed

        def done(finished: asyncio.Task[None]) -> None:
            tasks.discard(finished)
            if self._held.get(claimed.delivery_id) is claimed:
                del self._held[claimed.delivery_id]
            self._attempt_ended(endpoint.endpoint_id)

        task.add_done_callback(done)

    async def _attempt(self, endpoint: Target, claimed: Claimed) -> None:
        slots = self._slots.setdefault(
            endpoint.endpoint_id, asyncio.Semaphore(self._settings.max_in_flight)
        )
        try:
            # The slot covers the HTTP attempt only: the next one starts while this one's
            # outcome is written (in a batch with the others that ended meanwhile).
            async with slots:
                if self._stopping:  # given back at stop, due again at once
                    self._unattempted.append(claimed)
                    return
                reply = await self._send(endpoint, claimed)
            if reply is not None:
                await self._record(endpoint, claimed, reply)
        except asyncio.CancelledError:
            raise
        except Exception as error:
            # The claim expires and another pass (here or in another process) tries again.
            log.warning(
                "webhook delivery %s to %s could not be recorded: %s",
                claimed.webhook_id,
                endpoint.endpoint_id,
                type(error).__name__,
            )

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

    async def _record(self, endpoint: Target, claimed: Claimed, reply: Reply) -> None:
        completion = await self._recorder.record(Outcome(claimed, reply, self._clock()))
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

    def wake(self) -> None:
        """Start a pass soon (once the gap after the last one has passed) rather than at
        the next poll: new work was queued."""
        self._soon = True
        self._stir.set()

    def _attempt_ended(self, endpoint_id: str) -> None:
        """Have the next pass come soon, or now when the endpoint's claimed deliveries not
        yet ended are running low."""
        left = len(self._in_flight.get(endpoint_id, ()))
        if left < LOW_ROUNDS * self._settings.max_in_flight:
            self._urgent = True
        self._soon = True
        self._stir.set()

    async def settle(self) -> None:
        """Wait for every attempt in flight to be recorded (tests, shutdown)."""
        while tasks := [t for group in self._in_flight.values() for t in group]:
            await asyncio.gather(*tasks, return_exceptions=True)

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
        """Record the outcome batches no pass took (the loop has ended)."""
        ended, self._ended = self._ended, []
        for outcomes, future in ended:
            try:
                async with self._record_connection.transaction() as session:
                    completions = await complete_in(session, outcomes, self._disable_after_ms)
            except Exception as error:
                future.set_exception(error)
            else:
                future.set_result(completions)

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
        try:
            async with asyncio.timeout(self._settings.timeout_s + 1):
                await self.settle()
        except TimeoutError:
            for group in self._in_flight.values():
                for task in group:
                    task.cancel()
        await self._recorder.aclose()
        if self._unattempted:
            with contextlib.suppress(Exception):  # else their claims expire
                await queue.release(self._db, self._unattempted)
            self._unattempted = []
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


def _outcome(reply: Reply, completion: Completion) -> str:
    """The outcome label of an attempt: delivered, retrying, failed, or gone (a 410)."""
    if reply.succeeded:
        return "delivered"
    if reply.status_code == 410:
        return "gone"
    return "failed" if completion.status == "failed" else "retrying"
