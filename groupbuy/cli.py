"""The `groupbuy` command: `groupbuy serve` runs the HTTP API (and, in the same process, the
scheduled jobs); `groupbuy worker` runs only the scheduled jobs, beside a service elsewhere."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import secrets
import signal
import socket
import sys
from collections.abc import Iterator, Sequence
from types import FrameType

from groupbuy import __version__
from groupbuy.api import ACCESS_LOGGER
from groupbuy.api.accesslog import BufferedLineHandler, CachedTimeFormatter
from groupbuy.metrics import multiprocess_dir
from groupbuy.settings import Settings, SettingsError, load_settings
from groupbuy.storage.redis_client import describe

_LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


def _settings_for_serve(args: argparse.Namespace) -> tuple[Settings, str | None]:
    settings = load_settings(args.config)
    server = {
        k: v
        for k, v in (("host", args.host), ("port", args.port), ("workers", args.workers))
        if v is not None
    }
    if server:
        settings = settings.replace("server", **server)
    generated = None
    if not settings.auth.api_keys:
        generated = f"dev-{secrets.token_urlsafe(24)}"
        settings = settings.replace("auth", api_keys=(f"admin:{generated}",))
    return settings, generated


def _redis_for_serve(settings: Settings, stack: contextlib.ExitStack) -> tuple[Settings, str]:
    """With no Redis URL, start the embedded engine (stopped when `stack` closes) and point
    the settings at its socket. Returns the settings and what the start-up message says."""
    if not settings.redis.embedded:
        return settings, describe(settings.redis)
    from groupbuy.storage.embedded import engine_for

    engine = engine_for(settings.embedded)
    if engine is None:  # the in-process fakeredis, chosen or the fallback (warned)
        if settings.server.workers > 1:
            raise SettingsError(
                "several workers need a Redis server, and the in-process fakeredis lives in "
                "one process: set GROUPBUY_REDIS_URL, or let [embedded] run a server"
            )
        return settings, describe(settings.redis)
    engine.start()  # from the main thread, which lives as long as the service
    stack.callback(engine.stop)
    engine.keep_alive()
    return settings.replace("redis", url=engine.url), engine.describe()


class _Stopped(Exception):
    """SIGINT or SIGTERM arrived: stop gracefully (the engine after the server)."""


@contextlib.contextmanager
def _stopping_on_signals() -> Iterator[None]:
    """SIGINT and SIGTERM raise _Stopped in the main thread, so cleanup runs. uvicorn handles
    both while it serves, then raises the one it got again once it has finished."""

    def stop(_signum: int, _frame: FrameType | None) -> None:
        raise _Stopped

    previous = {signum: signal.signal(signum, stop) for signum in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    except _Stopped:
        pass
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def serve(args: argparse.Namespace) -> int:
    """Run the API with uvicorn until interrupted."""
    from groupbuy.storage.embedded import EngineError

    try:
        settings, generated = _settings_for_serve(args)
    except (SettingsError, OSError) as exc:
        print(f"groupbuy: {exc}", file=sys.stderr)
        return 2
    _configure_logging(settings)
    with _stopping_on_signals(), contextlib.ExitStack() as stack:
        try:
            settings, redis_line = _redis_for_serve(settings, stack)
        except (SettingsError, EngineError, OSError) as exc:
            print(f"groupbuy: {exc}", file=sys.stderr)
            return 2
        _run_server(settings, redis_line, generated)
    return 0


def _run_server(settings: Settings, redis_line: str, generated: str | None) -> None:
    """Print the start-up message, then serve with uvicorn (one worker or several)."""
    import uvicorn

    from groupbuy.api.app import create_app

    host, port = settings.server.host, settings.server.port
    print(f"groupbuy {__version__} listening on http://{host}:{port}")
    print(f"  redis:    {redis_line}")
    print(f"  database: {settings.database.effective_url}")
    if generated:
        print("  no API keys configured; a development admin key was generated for this run:")
        print(f"    export GROUPBUY_KEY={generated}")
        print('    curl -H "Authorization: Bearer $GROUPBUY_KEY" ...')
    else:
        print(
            "  API keys: from config.toml / GROUPBUY_API_KEYS; send 'Authorization: Bearer <key>'"
        )
    sys.stdout.flush()
    if settings.server.workers > 1:
        # Each worker process builds its own app from the environment: hand it what this
        # process decided (the engine's socket, a generated key). The workers share their
        # metrics through files: the directory must be set before they start.
        os.environ["GROUPBUY_SERVER_WORKERS"] = str(settings.server.workers)
        os.environ["GROUPBUY_REDIS_URL"] = settings.redis.url
        os.environ["GROUPBUY_API_KEYS"] = ",".join(settings.auth.api_keys)
        with multiprocess_dir(needed=True):
            run_workers("groupbuy.cli:app_from_environment", host, port, settings.server.workers)
    else:
        uvicorn.run(create_app(settings), host=host, port=port, log_level="warning")


def run_workers(app_factory: str, host: str, port: int, workers: int) -> None:
    """What uvicorn.run does for several workers, with TCP_NODELAY on the shared socket.

    uvicorn binds that socket with protocol 0, so asyncio does not turn Nagle off on the
    accepted connections and every keep-alive answer waits ~40 ms for a delayed ACK
    (measured: 45 ms per request with 2 workers, 1.4 ms with this option set). Accepted
    sockets inherit the option from the listening one on Linux.
    """
    import uvicorn
    from uvicorn.supervisors import Multiprocess

    config = uvicorn.Config(
        app_factory,
        factory=True,
        host=host,
        port=port,
        workers=workers,
        log_level="warning",
    )
    sock = config.bind_socket()
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    Multiprocess(config, sockets=[sock]).run()


def worker(args: argparse.Namespace) -> int:
    """Run only the scheduler (records to SQL, sweeps, expiry, repair, reconcile) until stopped."""
    try:
        settings = load_settings(args.config)
    except (SettingsError, OSError) as exc:
        print(f"groupbuy: {exc}", file=sys.stderr)
        return 2
    if settings.redis.embedded:
        # Attach to the engine a running `groupbuy serve` keeps in the same data directory.
        from groupbuy.storage.embedded import running_engine_url

        url = running_engine_url(settings.embedded)
        if url is None:
            print(
                "groupbuy: the worker needs a Redis server: set GROUPBUY_REDIS_URL, or start "
                f"`groupbuy serve` on the data directory {settings.embedded.data_dir} first",
                file=sys.stderr,
            )
            return 2
        settings = settings.replace("redis", url=url)
    _configure_logging(settings)
    print(
        f"groupbuy {__version__} worker: redis {describe(settings.redis)}, "
        f"database {settings.database.effective_url}"
    )
    asyncio.run(_work(settings))
    return 0


async def _work(settings: Settings) -> None:
    from groupbuy.services import build_services, running

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop.set)
    async with running(build_services(settings)):
        await stop.wait()


def app_from_environment() -> object:
    """An app built from config.toml and GROUPBUY_* (for multi-worker uvicorn)."""
    from groupbuy.api.app import create_app

    settings = load_settings()
    _configure_logging(settings)  # a spawned worker does not inherit the parent's logging
    return create_app(settings)


def _configure_logging(settings: Settings) -> None:
    """Log INFO and up to stderr; with access_log_json each access line is bare JSON."""
    logging.basicConfig(level=logging.INFO, format=_LOG_FORMAT)  # no-op once configured
    access = logging.getLogger(ACCESS_LOGGER)
    if not access.handlers:
        # One line per request: written in batches, not one system call each.
        handler = BufferedLineHandler()
        line_format = "%(message)s" if settings.server.access_log_json else _LOG_FORMAT
        handler.setFormatter(CachedTimeFormatter(line_format))
        access.addHandler(handler)
        access.propagate = False


_CONFIGURATION_HELP = """\
configuration:
  Settings come from config.toml (--config, else $GROUPBUY_CONFIG, else ./config.toml
  when present, else the built-in defaults), then from environment variables named
  GROUPBUY_<SECTION>_<NAME> for the key <name> of the section [<section>], which win
  over the file (e.g. GROUPBUY_SERVER_PORT=9000). An unknown GROUPBUY_* variable is
  warned about at start-up. The main ones:
    GROUPBUY_REDIS_URL        redis://host:port/db or unix:///path; unset: the embedded
                              engine, kept in GROUPBUY_EMBEDDED_DATA_DIR
    GROUPBUY_DATABASE_URL     sqlite+aiosqlite:///path.db or postgresql+asyncpg://...;
                              unset: ./groupbuy.db
    GROUPBUY_API_KEYS         role:secret[,role:secret...], role service or admin;
                              unset: serve generates an admin key for the run
"""

_SERVE_HELP = (
    "Serve the HTTP API with uvicorn until SIGINT or SIGTERM. Each process also runs the "
    "scheduled jobs when it holds the scheduler lease. Flags override [server] settings."
)
_SERVE_EPILOG = (
    _CONFIGURATION_HELP
    + """    GROUPBUY_SERVER_HOST, GROUPBUY_SERVER_PORT, GROUPBUY_SERVER_WORKERS
                              what --host, --port and --workers set
    GROUPBUY_SERVER_HEADER_TIMEOUT_S, GROUPBUY_SERVER_BODY_TIMEOUT_S
                              slow clients are cut off after these
exit status: 0 after a signal, 2 for a configuration error, 1 when the port is in use.
"""
)
_WORKER_HELP = (
    "Run only the scheduled jobs (records to SQL, sweeps, expiry, repair, reconcile) until "
    "SIGINT or SIGTERM, beside `groupbuy serve` processes that run with "
    "GROUPBUY_SCHEDULER_ENABLED=false or compete for the same lease."
)
_WORKER_EPILOG = (
    _CONFIGURATION_HELP
    + """  With no GROUPBUY_REDIS_URL the worker attaches to the engine a running
  `groupbuy serve` keeps in the same GROUPBUY_EMBEDDED_DATA_DIR.
exit status: 0 after a signal, 2 for a configuration error.
"""
)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the `groupbuy` console script."""
    parser = argparse.ArgumentParser(
        prog="groupbuy",
        description=__doc__,
        epilog=_CONFIGURATION_HELP + "Run `groupbuy serve --help` for the server's settings.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"groupbuy {__version__}")
    commands = parser.add_subparsers(dest="command", required=True)
    run = commands.add_parser(
        "serve",
        help="run the HTTP API",
        description=_SERVE_HELP,
        epilog=_SERVE_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    run.add_argument("--host", help="interface to listen on (default from config)")
    run.add_argument("--port", type=int, help="port to listen on (default from config)")
    run.add_argument("--workers", type=int, help="worker processes (default from config)")
    run.add_argument(
        "--config", help="path to config.toml (default: $GROUPBUY_CONFIG or ./config.toml)"
    )
    run.set_defaults(func=serve)
    work = commands.add_parser(
        "worker",
        help="run the scheduled jobs alone (records to SQL, sweeps, expiry, repair)",
        description=_WORKER_HELP,
        epilog=_WORKER_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    work.add_argument(
        "--config", help="path to config.toml (default: $GROUPBUY_CONFIG or ./config.toml)"
    )
    work.set_defaults(func=worker)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format=_LOG_FORMAT)
    return int(args.func(args))


if __name__ == "__main__":
    raise SystemExit(main())
