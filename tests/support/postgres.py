"""Start and stop a throwaway PostgreSQL cluster on a free loopback port (tests and benchmarks).

`initdb` in a temporary directory, `pg_ctl start` on 127.0.0.1 with the socket in that
directory, `pg_ctl stop -m immediate` and the directory removed at the end. PostgreSQL
refuses to run as root, so as root both run as the `postgres` user (the Debian packages
create it) on a directory it owns. The binaries come from PATH or Debian's versioned
directory (/usr/lib/postgresql/<major>/bin); the test command installs them when missing.
"""

from __future__ import annotations

import glob
import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from tests.support.servers import free_port

# The role the cluster is made with (trust authentication on loopback only).
USER = "gb"


def postgres_bin_dir() -> Path | None:
    """Where initdb and pg_ctl are: the newest /usr/lib/postgresql/<major>/bin (Debian keeps
    them off PATH), else the directory pg_ctl on PATH resolves to."""
    versions = sorted(
        glob.glob("/usr/lib/postgresql/*/bin/pg_ctl"),
        key=lambda path: int(Path(path).parent.parent.name),
    )
    if versions:
        return Path(versions[-1]).parent
    on_path = shutil.which("pg_ctl")
    return Path(on_path).resolve().parent if on_path else None


def _as_postgres_user(command: list[str]) -> list[str]:
    # initdb and postgres refuse root; the Debian packages create this user.
    return ["runuser", "-u", "postgres", "--", *command] if os.geteuid() == 0 else command


@dataclass
class PostgresProcess:
    """A cluster we started; `url(name)` is an asyncpg URL, `stop()` removes everything."""

    port: int
    directory: Path
    bin_dir: Path

    def url(self, database: str = "postgres") -> str:
        """The SQLAlchemy async URL of one database of this cluster."""
        return f"postgresql+asyncpg://{USER}@127.0.0.1:{self.port}/{database}"

    def create_database(self, name: str) -> str:
        """CREATE DATABASE `name` (a plain identifier); returns its URL."""
        self._run(["createdb", "-h", "127.0.0.1", "-p", str(self.port), "-U", USER, name])
        return self.url(name)

    def stop(self) -> None:
        """Stop the server at once (nothing to keep) and remove its directory."""
        self.crash(check=False)
        shutil.rmtree(self.directory, ignore_errors=True)

    def crash(self, check: bool = True) -> None:
        """`pg_ctl stop -m immediate`: every backend quits at once, as in a crash, without
        a checkpoint; the data stays, and the next `start` recovers it from the WAL (a
        commit survives when it was made with synchronous_commit on)."""
        self._pg_ctl(["-m", "immediate", "stop"], check=check)

    def start(self, tcp: bool = True) -> None:
        """Start the server again on its port and data (after `crash`); `tcp=False` listens
        on its Unix socket in `directory` only, where clients of 127.0.0.1 cannot reach it."""
        _start(self.bin_dir, self.directory / "data", _options(self.port, self.directory, tcp))

    def stop_fast(self) -> None:
        """`pg_ctl stop -m fast`: backends end, a checkpoint is written; the data stays."""
        self._pg_ctl(["-m", "fast", "-w", "stop"], check=True)

    def _pg_ctl(self, args: list[str], check: bool) -> None:
        subprocess.run(
            _as_postgres_user(
                [str(self.bin_dir / "pg_ctl"), "-D", str(self.directory / "data"), *args]
            ),
            check=check,
            capture_output=True,
            timeout=60,
        )

    def _run(self, command: list[str]) -> None:
        binary = [str(self.bin_dir / command[0]), *command[1:]]
        subprocess.run(binary, check=True, capture_output=True, timeout=60)


def start_postgres() -> PostgresProcess:
    """initdb a new cluster in a temporary directory and start it on a free loopback port."""
    bin_dir = postgres_bin_dir()
    if bin_dir is None:
        raise FileNotFoundError(
            "PostgreSQL is not installed: apt-get install postgresql (the test command does)"
        )
    directory = Path(tempfile.mkdtemp(prefix="groupbuy-pg-"))
    directory.chmod(0o755)
    data = directory / "data"
    data.mkdir()
    if os.geteuid() == 0:
        shutil.chown(directory, "postgres")
        shutil.chown(data, "postgres")
    port = free_port()
    try:
        subprocess.run(
            _as_postgres_user(
                [str(bin_dir / "initdb"), "-D", str(data), "-A", "trust", "-U", USER]
                + ["--no-sync", "-E", "UTF8"]
            ),
            check=True,
            capture_output=True,
            timeout=120,
        )
        _start(bin_dir, data, _options(port, directory, tcp=True))
    except (subprocess.CalledProcessError, subprocess.TimeoutExpired) as error:
        shutil.rmtree(directory, ignore_errors=True)
        output = getattr(error, "stderr", b"") or b""
        raise RuntimeError(f"PostgreSQL did not start: {output.decode(errors='replace')}") from None
    return PostgresProcess(port, directory, bin_dir)


def _options(port: int, directory: Path, tcp: bool) -> str:
    # The test server needs no durability of its own: fsync off makes each commit cheap.
    # (A test that crashes the server sets synchronous_commit on for its database: an
    # asynchronous commit can be lost by a crash of PostgreSQL itself.)
    listen = "127.0.0.1" if tcp else "''"
    return (
        f"-p {port} -k {directory} -c listen_addresses={listen} -c fsync=off "
        "-c synchronous_commit=off -c full_page_writes=off -c max_connections=300"
    )


def _start(bin_dir: Path, data: Path, options: str) -> None:
    subprocess.run(
        _as_postgres_user(
            [str(bin_dir / "pg_ctl"), "-D", str(data), "-o", options]
            + ["-l", str(data / "server.log"), "-w", "-t", "60", "start"]
        ),
        check=True,
        capture_output=True,
        timeout=90,
    )
