"""`groupbuy serve` as a real process (its own port, data directory and SQLite file), and
checks of processes by PID."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import httpx

from tests.support.servers import free_port
from tests.support.settings import API_KEYS

ENGINE_PID = re.compile(r"redis: +embedded \w+ \S+ \(.*, pid (\d+)\)")


@dataclass
class Service:
    """A running `groupbuy serve`: its URL, process and output (stdout and stderr)."""

    url: str
    process: subprocess.Popen[bytes]
    output: Path

    def text(self) -> str:
        """Everything the process printed so far."""
        return self.output.read_text(errors="replace")

    @property
    def engine_pid(self) -> int:
        """The embedded engine's PID, from the start-up message."""
        found = ENGINE_PID.search(self.text())
        assert found, self.text()
        return int(found[1])

    def stop(self, timeout_s: float = 30) -> int:
        """SIGTERM, wait for the graceful end (SIGKILL after `timeout_s`); the exit code.
        A process tree that does not stop in time has its stacks appended to the output
        first, so the failure shows where it hung."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                with self.output.open("a") as out:
                    out.write(f"\n[still running {timeout_s:.0f} s after SIGTERM]\n")
                    out.write(stacks(self.process.pid))
                self.process.kill()
                self.process.wait()
        return self.process.returncode


def descendants(pid: int) -> list[int]:
    """The process and everything it started, parents first (from /proc)."""
    found = [pid]
    for parent in found:
        for task in Path(f"/proc/{parent}/task").glob("*"):
            try:
                children = (task / "children").read_text().split()
            except OSError:
                continue
            found.extend(int(child) for child in children if int(child) not in found)
    return found


def stacks(pid: int) -> str:
    """Every thread's Python stack in the process and its children (py-spy), for a hang."""
    spy = shutil.which("py-spy", path=str(Path(sys.executable).parent)) or shutil.which("py-spy")
    if spy is None:
        return "(py-spy is not installed: no stacks)\n"
    dumps = []
    for each in descendants(pid):
        dump = subprocess.run(
            [spy, "dump", "--pid", str(each)], capture_output=True, text=True, timeout=30
        )
        if dump.returncode != 0:  # not a Python process (the engine), or gone meanwhile
            try:
                command = Path(f"/proc/{each}/cmdline").read_bytes()
            except OSError:
                command = b""
            shown = command.replace(b"\0", b" ").decode(errors="replace").strip()
            dump.stdout = f"{shown}: no stack\n"
        dumps.append(f"--- pid {each} ---\n{dump.stdout}")
    return "\n".join(dumps)


def service_environment(directory: Path, **variables: str) -> dict[str, str]:
    """The environment of a service on the embedded default, its files under `directory`."""
    return {
        **os.environ,
        "GROUPBUY_REDIS_URL": "",
        "GROUPBUY_API_KEYS": API_KEYS,
        "GROUPBUY_EMBEDDED_DATA_DIR": str(directory / "data"),
        "GROUPBUY_DATABASE_URL": f"sqlite+aiosqlite:///{directory / 'groupbuy.db'}",
        **variables,
    }


def start_service(
    directory: Path, *args: str, env: dict[str, str] | None = None, ready_s: float = 90
) -> Service:
    """Start `groupbuy serve` on a free port with its files under `directory`; return it
    once /healthz answers (AssertionError, with its output, if it exits or takes too long).

    `ready_s` only catches a start that hangs: each process imports ~3 s of CPU worth of
    modules, so `--workers 2` on a busy 2-core machine took over 30 s to answer."""
    port = free_port()
    output = directory / f"serve-{port}.log"
    with output.open("wb") as out:
        process = subprocess.Popen(
            [sys.executable, "-m", "groupbuy.cli", "serve", "--port", str(port), *args],
            cwd=directory,
            env=env if env is not None else service_environment(directory),
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    service = Service(f"http://127.0.0.1:{port}", process, output)
    deadline = time.monotonic() + ready_s
    while True:
        assert process.poll() is None, f"serve exited with {process.returncode}:\n{service.text()}"
        try:
            if httpx.get(f"{service.url}/healthz", timeout=1).status_code == 200:
                return service
        except httpx.HTTPError:
            pass
        if time.monotonic() > deadline:
            service.stop(timeout_s=1)
            raise AssertionError(f"serve did not answer in {ready_s} s:\n{service.text()}")
        time.sleep(0.05)


def is_running(pid: int) -> bool:
    """True while the process exists and is not a zombie (an orphan nobody has reaped)."""
    if not Path("/proc").is_dir():
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        return True
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] not in ("Z", "X")


def wait_gone(pid: int, timeout_s: float = 10) -> bool:
    """Wait until the process is gone (at most `timeout_s`); True if it went."""
    deadline = time.monotonic() + timeout_s
    while is_running(pid):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


def run_groupbuy(
    directory: Path, env: dict[str, str], *args: str, timeout_s: float = 120
) -> subprocess.CompletedProcess[str]:
    """Run a `groupbuy` command to its end (one that refuses to start, or stops by itself)."""
    return subprocess.run(
        [sys.executable, "-m", "groupbuy.cli", *args],
        env=env,
        cwd=directory,
        capture_output=True,
        text=True,
        timeout=timeout_s,
    )
