"""One run of `groupbuy demo`: set up (the webhook receiver and its endpoint, the
activity), play the sale and the storm for the duration, print a progress line each
second, then clean up (the endpoint removed) and print the summary.

Exit status: 0 once the run ended (its time was up, or SIGINT / SIGTERM stopped it early);
1 when the service could not be reached; 2 when it refused to set the demo up (the key)
or the options were wrong.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any

from groupbuy_client import GroupBuyAPIError, GroupBuyClient, GroupBuyTransportError

from groupbuy.demo.pacer import Pacer
from groupbuy.demo.plan import LOCK_TTL_S, TEAM_SIZE, WAITLIST_MAX_LEN, DemoOptions, Plan, problem
from groupbuy.demo.receiver import WebhookReceiver, receiving
from groupbuy.demo.shoppers import Sale
from groupbuy.demo.storm import Storm
from groupbuy.demo.tally import Tally, WebhookCounts

EXIT_DONE, EXIT_UNREACHABLE, EXIT_REFUSED = 0, 1, 2
PROGRESS_EVERY_S = 1.0
# After the sale, deliveries of its last events still come: the write-behind brings them to
# SQL within its flush interval (1 s), the deliverer within a poll (0.2 s). The receiver
# waits until none came for QUIET_S, and DRAIN_S at most.
QUIET_S = 2.0
DRAIN_S = 10.0
ALL_EVENTS = ["*"]
ALLOW_LOOPBACK = (
    "GROUPBUY_WEBHOOKS_ALLOW_HTTP=true GROUPBUY_WEBHOOKS_ALLOW_PRIVATE_NETWORKS=true "
    "([webhooks] allow_http and allow_private_networks; for development only)"
)


class SetUpRefused(Exception):
    """The service refused what the demo needs before the sale (exit 2)."""


def say(line: str) -> None:
    """Print one line of the demo's at once (it may be piped)."""
    print(line, flush=True)


async def run(options: DemoOptions, out: Callable[[str], None] = say) -> int:
    """Play one demo against `options.url`; the exit status."""
    plan = Plan.of(options)
    tally = Tally()
    pacer = Pacer(options.rate)
    stopping = asyncio.Event()
    out(
        f"groupbuy demo {plan.run_id} on {options.url}: {options.duration_s:g} s at most "
        f"{options.rate:g} requests/s, seed {options.seed}"
    )
    started = time.monotonic()
    with _stopping_on_signals(stopping), receiving(WebhookCounts()) as receiver:
        async with GroupBuyClient(options.url, options.key, sign=options.sign) as gb:
            endpoint = False
            try:
                endpoint = await _register(gb, pacer, plan, receiver, tally, out)
                sale = Sale(gb, pacer, plan, tally, options.seed, out)
                await sale.create()
            except (SetUpRefused, GroupBuyAPIError) as error:
                out(f"groupbuy demo: the service refused the set-up: {error}")
                if endpoint:
                    await _remove_endpoint(gb, plan, tally, out)
                return EXIT_REFUSED
            except GroupBuyTransportError as error:
                out(f"groupbuy demo: cannot reach {options.url}: {error.__cause__ or error}")
                return EXIT_UNREACHABLE
            out(
                f"activity {plan.activity_id}: teams of {TEAM_SIZE}, stock {plan.stock}, "
                f"locks last {LOCK_TTL_S} s, a line of up to {WAITLIST_MAX_LEN}; "
                f"console: {options.url}/console/activities/{plan.activity_id}"
            )
            storm = Storm(gb, pacer, plan, tally, out)
            await _play(sale, storm, plan, tally, stopping, started, out)
            interrupted = stopping.is_set()
            out("stopping: " + ("interrupted" if interrupted else "time is up"))
            if endpoint and not interrupted:
                await _drain(tally)
            removed = await _remove_endpoint(gb, plan, tally, out) if endpoint else None
    elapsed = time.monotonic() - started
    out(tally.line(elapsed, plan.packet_id))
    summary = _summary(options, plan, tally, pacer, elapsed, interrupted, removed)
    out("summary: " + _summary_text(summary))
    if options.summary_path is not None:
        options.summary_path.write_text(json.dumps(summary, indent=2) + "\n")
    return EXIT_DONE


async def _register(
    gb: GroupBuyClient,
    pacer: Pacer,
    plan: Plan,
    receiver: WebhookReceiver,
    tally: Tally,
    out: Callable[[str], None],
) -> bool:
    """Register the receiver as an endpoint for every event; False (said why) when the
    service refuses a loopback http:// URL."""
    try:
        created = await pacer.send(
            lambda: gb.create_webhook(
                plan.endpoint_id,
                receiver.url,
                ALL_EVENTS,
                description="groupbuy demo's receiver (removed when the demo ends)",
            )
        )
    except GroupBuyAPIError as error:
        if error.status in (401, 403):
            raise SetUpRefused(f"{error} (the demo needs an admin key)") from error
        out(f"webhooks: off: the service refused {receiver.url} ({error}).")
        out(f"  To see webhooks in the demo, start the service with {ALLOW_LOOPBACK}.")
        return False
    secret = created.get("secret")
    if not secret:  # a repeat of a registration: only the first shows the secret
        raise SetUpRefused(f"endpoint {plan.endpoint_id} exists already: its secret is unknown")
    receiver.use_secret(secret)
    tally.webhooks = receiver.counts
    out(f"webhooks: endpoint {plan.endpoint_id} -> {receiver.url}, every delivery verified")
    return True


async def _play(
    sale: Sale,
    storm: Storm,
    plan: Plan,
    tally: Tally,
    stopping: asyncio.Event,
    started: float,
    out: Callable[[str], None],
) -> None:
    """The sale from now, the storm at its time, a progress line each second; until the
    plan's duration has passed since `started` or `stopping` is set."""

    async def storm_later() -> None:
        await asyncio.sleep(max(0.0, started + plan.storm_at_s - time.monotonic()))
        await storm.run()

    async def progress() -> None:
        while True:
            await asyncio.sleep(PROGRESS_EVERY_S)
            out(tally.line(time.monotonic() - started, plan.packet_id))

    tasks = [asyncio.create_task(work) for work in (sale.run(), storm_later(), progress())]
    left_s = started + plan.duration_s - time.monotonic()
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(stopping.wait(), timeout=max(0.0, left_s))
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


async def _drain(tally: Tally) -> None:
    """Wait for the deliveries of the sale's last events: until none came for QUIET_S,
    DRAIN_S at most."""
    counts = tally.webhooks
    if counts is None:
        return
    deadline = time.monotonic() + DRAIN_S
    last, quiet_since = -1, time.monotonic()
    while time.monotonic() < deadline:
        seen = counts.verified + counts.repeated + counts.unverified
        if seen != last:
            last, quiet_since = seen, time.monotonic()
        elif time.monotonic() - quiet_since >= QUIET_S:
            return
        await asyncio.sleep(QUIET_S / 10)


async def _remove_endpoint(
    gb: GroupBuyClient, plan: Plan, tally: Tally, out: Callable[[str], None]
) -> bool:
    """Remove the demo's endpoint (never a pacer's turn: clean-up comes first); whether it
    is gone."""
    try:
        await gb.delete_webhook(plan.endpoint_id)
    except GroupBuyAPIError as error:
        if error.code != "endpoint_not_found":
            out(f"webhooks: endpoint {plan.endpoint_id} NOT removed: {error}")
            return False
    except GroupBuyTransportError as error:
        out(f"webhooks: endpoint {plan.endpoint_id} NOT removed: {error}")
        return False
    if tally.webhooks is not None:
        out(f"webhooks: endpoint {plan.endpoint_id} removed")
    return True


def _summary(
    options: DemoOptions,
    plan: Plan,
    tally: Tally,
    pacer: Pacer,
    elapsed_s: float,
    interrupted: bool,
    removed: bool | None,
) -> dict[str, Any]:
    return {
        "run_id": plan.run_id,
        "url": options.url,
        "activity_id": plan.activity_id,
        "packet_id": plan.packet_id,
        "endpoint_id": plan.endpoint_id if tally.webhooks is not None else None,
        "endpoint_removed": removed,
        "seed": options.seed,
        "rate": options.rate,
        "duration_s": options.duration_s,
        "elapsed_s": round(elapsed_s, 1),
        "stopped_by": "signal" if interrupted else "time",
        "requests": pacer.requests,
        "stock": plan.stock,
        **tally.summary(),
    }


def _summary_text(summary: dict[str, Any]) -> str:
    hooks = summary["webhooks"]
    webhooks = (
        "webhooks off"
        if hooks is None
        else f"webhooks: {hooks['verified']} verified, {hooks['unverified']} not verified, "
        f"endpoint {'removed' if summary['endpoint_removed'] else 'NOT removed'}"
    )
    return (
        f"{summary['locks']} locks, {summary['paid']} paid, {summary['abandoned']} abandoned "
        f"({summary['unlocked']} unlocked, {summary['expired']} expired); "
        f"teams: {summary['teams_opened']} opened, {summary['teams_formed']} formed; "
        f"line: {summary['queued']} queued, {summary['offered']} offered, "
        f"{summary['walked_away']} walked away, {summary['restocked']} units restocked; "
        f"{_packet_text(summary)}; {webhooks}; "
        f"{summary['requests']} requests in {summary['elapsed_s']:g} s"
    )


def _packet_text(summary: dict[str, Any]) -> str:
    if not summary["packet_shares"]:
        return "no packet sent"
    return (
        f"packet {summary['packet_id']}: {summary['grabbed']}/{summary['packet_shares']} "
        f"grabbed, {summary['grabs_sold_out']} too late"
    )


@contextlib.contextmanager
def _stopping_on_signals(stopping: asyncio.Event) -> Iterator[None]:
    """SIGINT (Ctrl-C) and SIGTERM set `stopping`: the sale ends and clean-up runs."""
    loop = asyncio.get_running_loop()
    signums = (signal.SIGINT, signal.SIGTERM)
    for signum in signums:
        loop.add_signal_handler(signum, stopping.set)
    try:
        yield
    finally:
        for signum in signums:
            loop.remove_signal_handler(signum)


def main(options: DemoOptions) -> int:
    """`groupbuy demo`: check the options, play the demo; the exit status."""
    wrong = problem(options)
    if wrong is not None:
        print(f"groupbuy demo: {wrong}", file=sys.stderr)
        return EXIT_REFUSED
    return asyncio.run(run(options))
