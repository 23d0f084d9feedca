"""The HTTP benchmark's server processes: `groupbuy serve` and the bare app.

Each server runs in its own process group on a free loopback port, is ready once
/healthz answers, and is stopped with SIGTERM (then SIGKILL) even on error. Several
groupbuy servers may share one Redis: each gets its own key prefix (and so its own
scheduler lease) and its own SQLite file, so none writes or sweeps the others' data.
`wait_idle` lets a round start only once every server has finished the work a previous
round left behind (write-behind to SQLite, the reads of the checks): a server still busy
would slow whichever contender runs next.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx

from tests.support.servers import free_port

REPO = Path(__file__).resolve().parents[1]
ADMIN_KEY, SERVICE_KEY = "bench-admin-key-0123456789", "bench-service-key-0123456789"
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
IDLE_WINDOW_S, IDLE_CPU_SHARE, IDLE_TIMEOUT_S = 0.5, 0.1, 15.0
# The storms' synthetic users act hundreds of times a second each, a pace no shopper has:
# the per-user rate limits would refuse most of it. The per-key limits stay at their
# defaults; benchmarks/http_ratelimit.py measures the cost of both at the defaults.
BENCHMARK_USERS = {
    f"GROUPBUY_RATELIMIT_{route_class.upper()}_USER_QUOTA": "1000000"
    for route_class in ("seat", "grab", "send", "read")
}


@dataclass
class Server:
    """A running server: its URL, process and log."""

    url: str
    process: subprocess.Popen[bytes]
    log: Path

    def log_errors(self) -> int:
        """Tracebacks and ERROR lines in the log so far."""
        text = self.log.read_text(errors="replace")
        return text.count("Traceback") + text.count(" ERROR ")


@contextlib.contextmanager
def serve(
    args: list[str], env: dict[str, str], port: int, log: Path, cwd: Path = REPO
) -> Iterator[Server]:
    """Run a server in its own process group (from the checkout `cwd`: `python -m` imports
    the package found there); yield it once /healthz answers."""
    url = f"http://127.0.0.1:{port}"
    with log.open("wb") as out:
        process = subprocess.Popen(
            args, cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
        try:
            deadline = time.monotonic() + 30
            while True:
                if process.poll() is not None:
                    raise RuntimeError(f"{args} exited with {process.returncode}; see {log}")
                try:
                    if httpx.get(f"{url}/healthz", timeout=1).status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                if time.monotonic() > deadline:
                    raise RuntimeError(f"{args} did not answer /healthz in 30 s; see {log}")
                time.sleep(0.1)
            yield Server(url, process, log)
        finally:
            stop(process)


def stop(process: subprocess.Popen[bytes]) -> None:
    """SIGTERM, up to 10 s to finish, then SIGKILL to the whole process group."""
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, signal.SIGKILL)  # workers left behind in our group, if any


def create_schema(url: str) -> None:
    """Migrate the schema first, as `groupbuy db upgrade` does."""
    from groupbuy.migrations import upgrade
    from groupbuy.storage.db import Database

    async def create() -> None:
        database = Database(url)
        try:
            await upgrade(database)
        finally:
            await database.dispose()

    asyncio.run(create())


def groupbuy_command(
    server: str, redis_url: str, workdir: Path, workers: int, tag: str, **settings: str
) -> tuple[list[str], dict[str, str], int]:
    """(argv, environment, port) of `groupbuy serve` (server "uvicorn"), with a key prefix
    and a SQLite file
    of its own; with no `redis_url`, `groupbuy serve` runs the embedded engine on a data
    directory of its own. `settings` are more GROUPBUY_* variables."""
    database = workdir / f"bench-{tag}.db"
    database.unlink(missing_ok=True)
    create_schema(f"sqlite+aiosqlite:///{database}")
    env = {
        **os.environ,
        "GROUPBUY_REDIS_URL": redis_url,
        "GROUPBUY_REDIS_KEY_PREFIX": f"gb{tag}",
        "GROUPBUY_DATABASE_URL": f"sqlite+aiosqlite:///{database}",
        "GROUPBUY_API_KEYS": f"admin:{ADMIN_KEY},service:{SERVICE_KEY}",
        "GROUPBUY_SCHEDULER_ENABLED": "true",
        "GROUPBUY_EMBEDDED_DATA_DIR": str(workdir / f"embedded-{tag}"),
        **BENCHMARK_USERS,
        **settings,
    }
    port = free_port()
    if server != "uvicorn":
        raise ValueError(f"unknown server {server!r}")
    args = [sys.executable, "-m", "groupbuy.cli", "serve", "--host", "127.0.0.1"]
    args += ["--port", str(port), "--workers", str(workers)]
    return args, env, port


def bare_command(redis_url: str, workers: int) -> tuple[list[str], dict[str, str], int]:
    """(argv, environment, port) of benchmarks/bare_app.py under uvicorn."""
    port = free_port()
    env = {**os.environ, "BARE_REDIS_URL": redis_url}
    args = [sys.executable, "-m", "benchmarks.bare_app", "--host", "127.0.0.1"]
    args += ["--port", str(port), "--workers", str(workers)]
    return args, env, port


def _tree(pid: int) -> list[int]:
    """The process and its descendants (Linux /proc)."""
    pids, index = [pid], 0
    while index < len(pids):
        with contextlib.suppress(OSError):
            for task in Path(f"/proc/{pids[index]}/task").iterdir():
                children = (task / "children").read_text().split()
                pids.extend(int(c) for c in children)
        index += 1
    return pids


def _cpu_seconds(pids: list[int]) -> float:
    total = 0
    for pid in pids:
        with contextlib.suppress(OSError):
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            total += int(fields[11]) + int(fields[12])  # utime, stime
    return total / CLOCK_TICKS


def cpu_seconds(server: Server) -> float:
    """CPU time (user + system) the server's processes have used so far."""
    return _cpu_seconds(_tree(server.process.pid))


def wait_idle(servers: list[Server]) -> float:
    """Wait until the servers together use under 10% of a core over 0.5 s (at most 15 s);
    the seconds waited, or -1 when they never went idle."""
    began = time.monotonic()
    while time.monotonic() - began < IDLE_TIMEOUT_S:
        pids = [p for s in servers for p in _tree(s.process.pid)]
        before = _cpu_seconds(pids)
        time.sleep(IDLE_WINDOW_S)
        if _cpu_seconds(pids) - before < IDLE_CPU_SHARE * IDLE_WINDOW_S:
            return time.monotonic() - began
    return -1.0
