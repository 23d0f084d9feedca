"""The "Receiving webhooks" receiver of docs/webhooks.md, as written there, under uvicorn on
loopback: the service's deliverer reaches it, it verifies with standardwebhooks, answers the
`webhook.test` ping, handles each webhook-id once, and refuses what another secret signed."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest

from groupbuy.settings import WebhookSettings
from groupbuy.storage.db import Database
from groupbuy.webhooks.service import WebhookService
from groupbuy.webhooks.signing import headers, new_secret
from groupbuy.webhooks.store import EndpointSpec
from tests.support.live import serving
from tests.support.webhooks import FakeClock, feed, team_event

WEBHOOKS_DOC = Path(__file__).resolve().parent.parent.parent / "docs" / "webhooks.md"


def documented_receiver() -> str:
    """The Python block of the "Receiving webhooks" section of docs/webhooks.md."""
    section = WEBHOOKS_DOC.read_text(encoding="utf-8").split("## Receiving webhooks", 1)[1]
    return section.split("```python\n", 1)[1].split("```", 1)[0]


def failing_print(*_args: Any) -> None:
    """The receiver's work failing (its `print` stands for the shop's own work)."""
    raise RuntimeError("the shop's work failed")


async def test_the_documented_receiver_verifies_and_dedups_real_deliveries(
    db: Database,
    clock: FakeClock,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    # One attempt at a time: the receiver prints the events in feed order (two at once
    # may arrive either way round).
    settings = WebhookSettings(
        allow_http=True, allow_private_networks=True, timeout_s=5.0, max_in_flight=1
    )
    hooks = WebhookService(db, settings, clock=clock)
    # Registered first (the URL is fixed below): the secret the shop then configures.
    placeholder = "http://127.0.0.1:9/groupbuy-events"
    secret = str((await hooks.create(EndpointSpec("shop", placeholder, ("*",)))).body["secret"])
    monkeypatch.setenv("WEBHOOK_SECRET", secret)
    scope: dict[str, Any] = {}
    exec(compile(documented_receiver(), "docs/webhooks.md", "exec"), scope)
    with serving(scope["app"]) as port:
        url = f"http://127.0.0.1:{port}/groupbuy-events"
        try:
            await hooks.update("shop", {"url": url})
            await feed(db, team_event("team.formed", "t1", 3), team_event("team.failed", "t2", 2))
            await hooks.deliverer.tick()
            await hooks.deliverer.settle()
            page = await hooks.deliveries("shop", None, None, 10)
            assert [(d["status"], d["attempts"][0]["status_code"]) for d in page["deliveries"]] == [
                ("delivered", 204),
                ("delivered", 204),
            ]
            assert scope["handled"] == {"evt_1", "evt_2"}
            ping = await hooks.test("shop")  # the ping the same page says to send
            assert (ping["succeeded"], ping["status_code"]) == (True, 204)
            assert ping["webhook_id"] not in scope["handled"]
            printed = capsys.readouterr().out.splitlines()
            assert [line.split()[0] for line in printed] == ["team.formed", "team.failed"]
            # The same webhook-id again (a retry after a lost answer): answered, handled once.
            await hooks.replay("shop", 0, 1)
            await hooks.deliverer.tick()
            await hooks.deliverer.settle()
            assert capsys.readouterr().out == ""
            # Signed with another secret: refused.
            body = b'{"type":"team.formed","timestamp":"x","data":{}}'
            forged = headers([new_secret()], "evt_9", clock() // 1000, body)
            async with httpx.AsyncClient() as http:
                answer = await http.post(url, content=body, headers=forged)
            assert answer.status_code == 400
            assert "evt_9" not in scope["handled"]
            # Work that fails answers 500 and leaves the id unhandled: the retry does it.
            event = b'{"id":7,"type":"team.formed","at":"x","data":{"team_id":"t7"}}'
            body = b'{"type":"team.formed","timestamp":"x","data":' + event + b"}"
            signed = headers([secret], "evt_7", clock() // 1000, body)
            scope["print"] = failing_print
            async with httpx.AsyncClient() as http:
                try:
                    failed: int | None = (
                        await http.post(url, content=body, headers=signed)
                    ).status_code
                except httpx.TransportError:
                    failed = None  # uvicorn dropped the connection: a failed attempt as well
                assert failed in (500, None) and "evt_7" not in scope["handled"]
            scope["print"] = print
            async with httpx.AsyncClient() as http:  # (a new connection: that one was cut)
                retried = await http.post(url, content=body, headers=signed)
            assert retried.status_code == 204 and "evt_7" in scope["handled"]
        finally:
            await hooks.deliverer.stop()
