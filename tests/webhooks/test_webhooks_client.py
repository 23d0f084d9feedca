"""groupbuy_client.client's webhook methods against the in-process app (lifespan running, the
deliverer included), and their typed answers against the documented ones."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

import httpx
import pytest
from groupbuy_client.client import GroupBuyAPIError, GroupBuyClient

from groupbuy.api.app import create_app
from groupbuy.settings import Settings
from tests.support.http import ADMIN_KEY
from tests.support.receiver import Receiver
from tests.support.webhooks import verified


@pytest.fixture
async def admin(settings: Settings) -> AsyncIterator[GroupBuyClient]:
    local = settings.replace(
        "webhooks", allow_http=True, allow_private_networks=True, poll_interval_s=0.05
    )
    app = create_app(local)
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with GroupBuyClient("http://groupbuy.test", ADMIN_KEY, transport=transport) as gb:
            yield gb


async def test_every_webhook_method(admin: GroupBuyClient, receiver: Receiver) -> None:
    created = await admin.create_webhook(
        "shop", receiver.url, ["packet.sent"], description="the shop", ordering="entity"
    )
    secret = created["secret"]
    assert secret and created["ordering"] == "entity"
    assert "secret" not in await admin.create_webhook(
        "shop", receiver.url, ["packet.sent"], description="the shop", ordering="entity"
    )
    assert [w["endpoint_id"] for w in (await admin.webhooks(limit=5))["webhooks"]] == ["shop"]
    assert (await admin.get_webhook("shop"))["description"] == "the shop"
    ping = await admin.test_webhook("shop")
    assert ping["succeeded"] and ping["status_code"] == 200
    await admin.deposit("alice", 500, "r1")
    await admin.send_packet("alice", 300, 3, packet_id="pk1")
    deadline = time.monotonic() + 10
    while not (page := await admin.webhook_deliveries("shop"))["deliveries"]:
        assert time.monotonic() < deadline, "no delivery was recorded"
        await asyncio.sleep(0.05)
    [delivery] = page["deliveries"]
    assert delivery["status"] == "delivered" and delivery["event_type"] == "packet.sent"
    assert (delivery["attempts_total"], delivery["older_attempts_cursor"]) == (1, None)
    tried = await admin.webhook_attempts("shop", delivery["webhook_id"], limit=5)
    assert tried["attempts"] == delivery["attempts"] and tried["next_cursor"] is None
    got = receiver.received[1]
    assert verified(secret, got)["data"]["data"]["packet_id"] == "pk1"
    queued = await admin.replay_webhook("shop", 0)
    assert queued["queued"] == 1
    rotated = await admin.rotate_webhook_secret("shop")
    assert rotated["secret"] != secret
    changed = await admin.update_webhook("shop", disabled=True)
    assert changed["disabled"] and changed["disabled_reason"] == "admin"
    assert await admin.delete_webhook("shop") == {"endpoint_id": "shop", "deleted": True}
    with pytest.raises(GroupBuyAPIError) as caught:
        await admin.get_webhook("shop")
    assert caught.value.code == "endpoint_not_found"
