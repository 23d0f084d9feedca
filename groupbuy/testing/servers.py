"""Start and stop a private redis-server on a free loopback port (tests and benchmarks)."""

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


def free_port() -> int:
    """A TCP port nobody listens on right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class RedisProcess:
    """A redis-server we started; `stop()` kills it by PID and removes its directory."""

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
    """Start redis-server (no persistence unless `extra` asks) and wait until it answers.

    A given `directory` is kept at stop (to restart on the same data); a new one is removed.
    """
    binary = shutil.which("redis-server")
    if binary is None:
        raise FileNotFoundError("redis-server is not installed (apt-get install redis-server)")
    owns_directory = directory is None
    directory = directory or Path(tempfile.mkdtemp(prefix="groupbuy-redis-"))
    port = port or free_port()
    args = [
        binary,
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
                    raise RuntimeError(f"redis-server did not start on port {port}") from None
                time.sleep(0.05)
    finally:
        client.close()
    return RedisProcess(port, process, directory, owns_directory)
