"""Screenshots of the console while `groupbuy demo` plays a sale: `python -m scripts.screenshots
[--out DIR]`.

Starts `groupbuy serve` in a temp dir (the embedded default; webhooks to a loopback receiver
allowed), runs `groupbuy demo` against it (DEMO_ARGS, about a minute) and meanwhile, signed
in to the console as a viewer in headless Chromium at 1280x800, saves one PNG per shot of
SHOTS: the overview once the red-packet storm is under way, then the demo's activity (its
sale view, then its full teams and their lines). Beside them, DIR/demo-shots.json records
each picture's page, time, the figures it shows (the text of each `data-field`) and its
SHA-256, and the demo's summary. A shot whose key figures stay idle ("–" or 0) fails the
run, as does a page that logs a console error. DIR is docs/console/ by default, where
README.md and docs/console.md show them. Needs Chromium and
chromedriver (`apt-get install -y chromium chromium-driver`).
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from tests.support.browser import (
    HEIGHT,
    KEYS,
    WIDTH,
    Browser,
    missing,
    serve,
    sign_in,
    start_chromium,
)

OUT = Path("docs/console")  # where README.md and docs/console.md show them
MANIFEST_NAME = "demo-shots.json"
MANIFEST = OUT / MANIFEST_NAME
# The demo the pictures show: a minute at the default rate, the same choices every time.
DEMO_DURATION_S = 60
DEMO_ARGS = ("--duration", str(DEMO_DURATION_S), "--rate", "50", "--seed", "2026")
STORM_SETTLE_S = 4.0  # after the storm starts: grabs/s (over ~10 s) shows it by then
DEMO_END_S = 60.0  # longest the demo may take past its duration (drain, clean-up)
FIGURES = (
    "return Object.fromEntries(Array.from(document.querySelectorAll('[data-field]'))"
    ".map(e => [e.dataset.field, e.textContent.trim()]))"
)
SCROLL_TO_HEADING = (
    "Array.from(document.querySelectorAll('h2'))"
    ".find(h => h.textContent.trim() === arguments[0]).scrollIntoView()"
)
IDLE = {"", "–", "-"}
_ACTIVITY = re.compile(r"^activity (\S+):")
_ELAPSED = re.compile(r"^t=(\d+)s ")


@dataclass(frozen=True)
class Shot:
    """One picture: its file name, the page (`{activity}` is the demo's activity), the
    element to wait for, when in the demo to take it, and the figures that must not be
    idle in it."""

    name: str
    path: str
    ready: str
    key_figures: tuple[str, ...]
    after_storm_s: float | None = None  # this long after the storm started
    at_s: float | None = None  # at this second of the demo
    heading: str | None = None  # scrolled to this h2 (else the page's top)


SHOTS: tuple[Shot, ...] = (
    Shot(
        "demo-overview",
        "/console",
        ".live-state.on",
        ("requests_per_s", "locks_per_s", "grabs_per_s"),
        after_storm_s=STORM_SETTLE_S,
    ),
    Shot(
        "demo-activity",
        "/console/activities/{activity}",
        ".live-state.on",
        ("seats_held", "locks_taken_window", "confirmed_window", "conversion"),
        at_s=40,
    ),
    Shot(
        "demo-activity-teams",
        "/console/activities/{activity}?teams=full",
        "table[data-teams=full]",
        ("members", "teams_formed", "locks_taken_window"),
        at_s=44,
        heading="Now",
    ),
)
ROLE = "viewer"  # the pictures show what an operator watches, without the action forms


def idle_figures(shot: dict[str, Any]) -> list[str]:
    """The key figures of a manifest's shot that look idle: absent, "–" or zero."""
    idle = []
    for name in shot["key_figures"]:
        value = str(shot["figures"].get(name, "")).strip()
        if value in IDLE:
            idle.append(name)
            continue
        with contextlib.suppress(ValueError):
            if float(value.split()[0]) == 0:
                idle.append(name)
    return idle


@dataclass
class Demo:
    """A running `groupbuy demo`: what its output said so far (echoed as it comes)."""

    process: subprocess.Popen[str]
    activity_id: str | None = None
    elapsed_s: int = 0
    storm_at: float | None = None  # time.monotonic() of its storm line
    lines: list[str] = field(default_factory=list)

    def follow(self) -> None:
        """Read the demo's output to its end (run in a thread)."""
        assert self.process.stdout is not None
        for line in self.process.stdout:
            line = line.rstrip("\n")
            self.lines.append(line)
            print(f"  demo| {line}", flush=True)
            if found := _ACTIVITY.match(line):
                self.activity_id = found[1]
            if found := _ELAPSED.match(line):
                self.elapsed_s = int(found[1])
            if line.startswith("storm: packet") and self.storm_at is None:
                self.storm_at = time.monotonic()

    def wait_for(self, what: str, condition: Callable[[], bool], limit_s: float) -> None:
        """Wait until `condition()`; RuntimeError when the demo ended or `limit_s` passed."""
        deadline = time.monotonic() + limit_s
        while not condition():
            if self.process.poll() is not None or time.monotonic() > deadline:
                shown = "\n".join(self.lines[-20:])
                raise RuntimeError(f"the demo never reached {what}:\n{shown}")
            time.sleep(0.1)


@contextlib.contextmanager
def demo_against(url: str, summary: Path) -> Iterator[Demo]:
    """`groupbuy demo` against `url` (DEMO_ARGS), its output followed; SIGINT (a clean stop)
    by PID if it still runs at the end."""
    package_root = str(Path(__file__).resolve().parent.parent)
    env = {**os.environ, "PYTHONPATH": package_root, "GROUPBUY_KEY": KEYS["admin"]}
    command = [sys.executable, "-m", "groupbuy.cli", "demo", "--url", url, *DEMO_ARGS]
    process = subprocess.Popen(
        [*command, "--summary", str(summary)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    demo = Demo(process)
    reader = threading.Thread(target=demo.follow, name="demo-output", daemon=True)
    reader.start()
    try:
        yield demo
    finally:
        if process.poll() is None:
            os.kill(process.pid, signal.SIGINT)
        process.wait(timeout=DEMO_END_S)
        reader.join(timeout=DEMO_END_S)


def take(browser: Browser, demo: Demo, shot: Shot, out: Path) -> dict[str, Any]:
    """Open the shot's page (its live numbers, and the sampling behind the charts, start),
    wait for its moment, open it again and wait for its key figures to leave idle, save
    the PNG; the manifest's entry."""
    assert demo.activity_id is not None
    path = shot.path.format(activity=demo.activity_id)
    browser.open(path)
    browser.element(shot.ready)
    if shot.after_storm_s is not None:
        demo.wait_for("its storm", lambda: demo.storm_at is not None, DEMO_END_S)
        storm_at = demo.storm_at or 0.0
        time.sleep(max(0.0, storm_at + shot.after_storm_s - time.monotonic()))
    if shot.at_s is not None:
        at_s = shot.at_s
        demo.wait_for(f"t={at_s:g}s", lambda: demo.elapsed_s >= at_s, DEMO_END_S + at_s)
    # Again: what the server draws at load (the charts) is drawn from the samples taken
    # while the page was watched since.
    browser.open(path)
    browser.element(shot.ready)
    entry: dict[str, Any] = {"key_figures": list(shot.key_figures), "figures": {}}

    def busy() -> bool:
        entry["figures"] = browser.driver.execute_script(FIGURES)
        return not idle_figures(entry)

    try:
        browser.wait_for(busy, f"busy figures on {path}")
    except Exception as error:
        raise RuntimeError(f"{path} stayed idle: {entry['figures']}") from error
    browser.assert_clean_console(f"on {path}")
    if shot.heading is not None:
        browser.driver.execute_script(SCROLL_TO_HEADING, shot.heading)
    target = out / f"{shot.name}.png"
    if not browser.driver.save_screenshot(str(target)):
        raise RuntimeError(f"no screenshot of {path}")
    data = target.read_bytes()
    return {
        "file": target.name,
        "page": path,
        "activity_id": demo.activity_id,
        "demo_t_s": demo.elapsed_s,
        "taken_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "width": WIDTH,
        "height": HEIGHT,
        "sha256": hashlib.sha256(data).hexdigest(),
        **entry,
    }


def shoot(out: Path, shots: Sequence[Shot] = SHOTS) -> list[Path]:
    """Start a service, play the demo, write one PNG per shot and the manifest into `out`;
    their paths."""
    out.mkdir(parents=True, exist_ok=True)
    entries = []
    with tempfile.TemporaryDirectory(prefix="groupbuy-demo-shots-") as directory:
        loopback_webhooks = {
            "GROUPBUY_WEBHOOKS_ALLOW_HTTP": "true",
            "GROUPBUY_WEBHOOKS_ALLOW_PRIVATE_NETWORKS": "true",
        }
        summary = Path(directory) / "summary.json"
        with serve(Path(directory), **loopback_webhooks) as served:
            driver = start_chromium()
            try:
                browser = Browser(driver, served.url)
                sign_in(browser, KEYS[ROLE])
                with demo_against(served.url, summary) as demo:
                    demo.wait_for("its activity", lambda: demo.activity_id is not None, 60)
                    for shot in shots:
                        entries.append(take(browser, demo, shot, out))
                    demo.process.wait(timeout=DEMO_DURATION_S + DEMO_END_S)
                if demo.process.returncode != 0:
                    raise RuntimeError(f"the demo exited with {demo.process.returncode}")
            finally:
                driver.quit()
        played = json.loads(summary.read_text())
    manifest = {
        "command": "python -m scripts.screenshots",
        "demo": {"command": " ".join(["groupbuy demo", *DEMO_ARGS]), **played},
        "shots": entries,
    }
    (out / MANIFEST_NAME).write_text(json.dumps(manifest, indent=2, ensure_ascii=False) + "\n")
    return [out / entry["file"] for entry in entries] + [out / MANIFEST_NAME]


def main(argv: Sequence[str] | None = None) -> int:
    """The command line: shoot SHOTS into --out while the demo runs."""
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
