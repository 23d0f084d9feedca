"""The console's tests run with a viewer key too, and webhooks that may target loopback."""

from __future__ import annotations

import pytest

from groupbuy.settings import Settings
from tests.support.console import VIEWER_KEY
from tests.support.settings import settings_for


@pytest.fixture
def settings(redis_url: str, database_url: str) -> Settings:
    """The suite's settings plus a viewer key; webhook endpoints on loopback over http are
    allowed (the test endpoint answers nothing) and no deliverer runs."""
    base = settings_for(redis_url, database_url)
    keys = (*base.auth.api_keys, f"viewer:{VIEWER_KEY}")
    return (
        base.replace("auth", api_keys=keys)
        .replace("webhooks", enabled=False, allow_http=True, allow_private_networks=True)
        .replace("console", live_interval_s=0.05, live_stream_s=0.3)
    )
