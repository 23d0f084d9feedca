"""`groupbuy demo` against a live `groupbuy serve`: the sale it plays shows in its summary,
in the API and on the console's activity page; and the screenshots the docs show were
taken while it ran (python -m scripts.screenshots)."""

from __future__ import annotations

import hashlib
import json
import re
import struct
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from scripts.screenshots import MANIFEST, idle_figures
from tests.support.console import csrf_of, parts_of
from tests.support.http import ADMIN, ADMIN_KEY
from tests.support.service import Service, run_groupbuy, service_environment, start_service

ROOT = Path(__file__).resolve().parent.parent
# A few seconds at a small rate: the storm comes at 30 % of the run, so within it.
DURATION_S = "6"
RATE = "25"
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
MIN_PNG_BYTES = 10 * 1024  # a 1280x800 page with text and numbers; a blank one is smaller
MAX_PNG_BYTES = 1024 * 1024  # one picture of the docs: kept small in the repository
IMAGE = re.compile(r"!\[[^\]]*\]\(([^)]+\.png)\)")


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Service]:
    """A service that lets the demo register its loopback http:// webhook receiver."""
    directory = tmp_path_factory.mktemp("demo")
    env = service_environment(
        directory,
        GROUPBUY_WEBHOOKS_ALLOW_HTTP="true",
        GROUPBUY_WEBHOOKS_ALLOW_PRIVATE_NETWORKS="true",
    )
    service = start_service(directory, env=env)
    try:
        yield service
    finally:
        assert service.stop() == 0, service.text()


@pytest.fixture(scope="module")
def played(live: Service, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The summary of one short demo run against the live service (exit status 0)."""
    directory = tmp_path_factory.mktemp("demo-run")
    summary = directory / "summary.json"
    run = run_groupbuy(
        directory,
        service_environment(directory),
        *("demo", "--url", live.url, "--key", ADMIN_KEY, "--seed", "7"),
        *("--duration", DURATION_S, "--rate", RATE, "--summary", str(summary)),
        timeout_s=60,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    assert "summary: " in run.stdout, run.stdout
    found: dict[str, Any] = json.loads(summary.read_text())
    return found


def console_panel(url: str, activity_id: str) -> dict[str, str]:
    """The `data-field` texts of the activity's live panel on its console page, read
    signed in as an admin over HTTP."""
    with httpx.Client(base_url=url, timeout=30, follow_redirects=True) as browser:
        form = browser.get("/console/signin")
        signed_in = browser.post(
            "/console/signin",
            data={"key": ADMIN_KEY, "csrf": csrf_of(form.text), "next": "/console"},
        )
        assert signed_in.status_code == 200 and "signin" not in str(signed_in.url), signed_in
        page = browser.get(f"/console/activities/{activity_id}")
        assert page.status_code == 200, page.text[:500]
    return parts_of(page.text).panels[("data-activity", activity_id)]


def test_the_demo_plays_every_part_of_the_sale_and_cleans_up(
    live: Service, played: dict[str, Any]
) -> None:
    """Locks, payments, grabs and verified deliveries all happened; nothing failed to
    verify; the demo's endpoint is gone from the service."""
    for count in ("locks", "paid", "teams_opened", "grabbed", "requests"):
        assert played[count] > 0, (count, played)
    assert played["stopped_by"] == "time" and played["no_answer"] == 0, played
    hooks = played["webhooks"]
    assert hooks is not None and hooks["verified"] > 0, played
    assert hooks["unverified"] == 0, played
    assert played["endpoint_removed"] is True, played
    gone = httpx.get(f"{live.url}/v1/admin/webhooks/{played['endpoint_id']}", headers=ADMIN)
    assert gone.status_code == 404, gone.text
    # Never above the rate (the last turn may start just before the end): requests/s.
    assert played["requests"] <= float(RATE) * played["elapsed_s"] + 1, played


def test_the_console_shows_the_demo_activity_busy(live: Service, played: dict[str, Any]) -> None:
    """The activity page's live panel shows the demo's members and teams, not an idle
    activity's zeros."""
    panel = console_panel(live.url, played["activity_id"])
    assert int(panel["members"]) >= played["paid"] > 0, panel
    assert int(panel["teams_open"]) + int(panel["teams_formed"]) >= 1, panel
    activity = httpx.get(f"{live.url}/v1/activities/{played['activity_id']}", headers=ADMIN)
    assert str(activity.json()["members"]) == panel["members"], (activity.text, panel)


def pictures_of(document: Path) -> list[Path]:
    """The PNG files a Markdown document shows, as paths."""
    return [(document.parent / link).resolve() for link in IMAGE.findall(document.read_text())]


def test_the_docs_pictures_of_the_demo_were_taken_while_it_ran() -> None:
    """Every picture README.md and docs/console.md show is a sane PNG; the README's and the
    demo pictures of console.md are the screenshot command's, as its manifest records them
    (same bytes), and show a busy console: no "–", no zero rate."""
    manifest = json.loads((ROOT / MANIFEST).read_text())
    shots = {
        (ROOT / MANIFEST).parent.joinpath(shot["file"]).resolve(): shot
        for shot in manifest["shots"]
    }
    readme, console = pictures_of(ROOT / "README.md"), pictures_of(ROOT / "docs/console.md")
    for picture in readme + console:
        data = picture.read_bytes()
        assert data[:8] == PNG_SIGNATURE, picture
        assert MIN_PNG_BYTES <= len(data) <= MAX_PNG_BYTES, (picture, len(data))
    assert readme[-1] in shots, readme  # the README's picture is of the demo
    assert set(shots) <= set(console), (sorted(shots), console)
    for picture, shot in shots.items():
        data = picture.read_bytes()
        assert hashlib.sha256(data).hexdigest() == shot["sha256"], picture
        assert struct.unpack(">II", data[16:24]) == (shot["width"], shot["height"]), picture
        assert idle_figures(shot) == [], (picture, shot["figures"])
    assert manifest["demo"]["activity_id"] in {shot["activity_id"] for shot in shots.values()}
