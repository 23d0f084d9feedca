"""Screenshots of the service's pages: `python -m tests.support.screenshots [--out DIR]`.

Starts `groupbuy serve` in a temp dir, fills it with demo data through the API (activities,
teams, locks, members, red packets and grabs), opens each page of SHOTS in headless
Chromium at 1280x800 and writes DIR/<name>.png. A page that logs a console error fails
the run. DIR is docs/console/ by default, where README.md and docs/*.md show them.
Needs Chromium and chromedriver (`apt-get install -y chromium chromium-driver`).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import httpx

from tests.support.browser import (
    KEYS,
    Browser,
    bearer,
    missing,
    serve,
    sign_in,
    start_chromium,
)


@dataclass(frozen=True)
class Shot:
    """One page to shoot: its file name, path, an element to wait for, and the role whose
    key signs in first (None: shot signed out)."""

    name: str
    path: str
    ready: str = "body"
    role: str | None = None


OUT = Path("docs/console")  # where README.md and docs/*.md show them
LIVE = ".live-state.on"  # a console page whose live updates are on
# The pages the command shoots, in order.
SHOTS: tuple[Shot, ...] = (
    Shot("home", "/", ready="#links"),
    Shot("docs", "/docs", ready=".swagger-ui .opblock"),
    Shot("console-overview", "/console", ready=LIVE, role="admin"),
    Shot("console-activities", "/console/activities", ready=LIVE, role="admin"),
    Shot("console-activity", "/console/activities/spring-sale-3", ready=LIVE, role="admin"),
    Shot("console-redpacket", "/console/redpackets/new-year-1", ready=LIVE, role="admin"),
    Shot("console-events", "/console/events", ready=LIVE, role="admin"),
    Shot("console-integrity", "/console/integrity", ready=".checks", role="admin"),
    Shot("console-webhooks", "/console/webhooks", ready="h1", role="admin"),
    Shot("console-audit", "/console/audit", ready="tr[data-audit]", role="admin"),
)


def add_demo_data(url: str) -> None:
    """A few activities with teams (formed, filling, locked seats), red packets half
    grabbed, through the API as a shop would call it; then an operator's action (a user
    blocked, with its reason, in the audit log), the records written to SQL and a reconcile
    report."""
    with httpx.Client(base_url=url, timeout=30) as api:

        def call(path: str, body: dict[str, object], role: str = "service") -> None:
            answer = api.post(path, json=body, headers=bearer(role))
            if answer.status_code not in (200, 201):
                raise RuntimeError(f"POST {path}: {answer.status_code} {answer.text}")

        for number, size in ((1, 2), (2, 3), (3, 5)):
            activity = f"spring-sale-{number}"
            body = {"activity_id": activity, "name": f"Spring sale #{number}", "team_size": size}
            call("/v1/activities", body, "admin")
            for team in range(1, 4):
                team_id = f"t{team}"
                path = f"/v1/activities/{activity}/teams"
                call(path, {"leader_id": f"{activity}-lead{team}", "team_id": team_id})
                for seat in range(1, min(team + 1, size)):  # team N: up to N seats past its leader
                    user = f"{activity}-{team_id}-u{seat}"
                    call(f"{path}/{team_id}/locks", {"user_id": user})
                    if seat % 2:  # every other locked user pays
                        call(f"{path}/{team_id}/members", {"user_id": user, "order_id": user})
        for number, (cents, count, grabs) in enumerate(((10_000, 10, 6), (5_000, 5, 5)), 1):
            sender, packet = f"sender{number}", f"new-year-{number}"
            deposit = {"amount_cents": cents, "reference": packet}
            call(f"/v1/accounts/{sender}/deposits", deposit, "admin")
            body = {"sender_id": sender, "amount_cents": cents, "count": count, "packet_id": packet}
            call("/v1/redpackets", body)
            for guest in range(grabs):
                call(f"/v1/redpackets/{packet}/grab", {"user_id": f"guest{guest}"})
        reason = {"reason": "scripted grabs from one device"}
        answers = [
            api.put("/v1/admin/blocked-users/bot-4711", json=reason, headers=bearer("admin"))
        ]
        for job in ("flush_records", "reconcile"):  # the lists read SQL; integrity its report
            answers.append(api.post(f"/v1/admin/jobs/{job}/run", headers=bearer("admin")))
        for answer in answers:
            if answer.status_code != 200:
                raise RuntimeError(f"{answer.request.url}: {answer.status_code} {answer.text}")


def shoot(out: Path, shots: Sequence[Shot] = SHOTS) -> list[Path]:
    """Start a service with demo data and write one PNG per shot into `out`; their paths."""
    out.mkdir(parents=True, exist_ok=True)
    written = []
    with (
        tempfile.TemporaryDirectory(prefix="groupbuy-shots-") as directory,
        serve(Path(directory)) as served,
    ):
        add_demo_data(served.url)
        driver = start_chromium()
        try:
            browser = Browser(driver, served.url)
            for shot in shots:
                driver.delete_all_cookies()
                if shot.role is not None:
                    sign_in(browser, KEYS[shot.role])
                browser.open(shot.path)
                browser.element(shot.ready)
                browser.assert_clean_console(f"on {shot.path}")
                target = out / f"{shot.name}.png"
                if not driver.save_screenshot(str(target)):
                    raise RuntimeError(f"no screenshot of {shot.path}")
                written.append(target)
        finally:
            driver.quit()
    return written


def main(argv: Sequence[str] | None = None) -> int:
    """The command line: shoot SHOTS into --out."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args(argv)
    reason = missing()
    if reason is not None:
        print(f"cannot take screenshots: {reason}", file=sys.stderr)
        return 2
    for path in shoot(args.out):
        print(f"{path} ({path.stat().st_size // 1024} KiB)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
