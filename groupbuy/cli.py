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
from collections.abc import Callable, Iterator, Sequence
from types import FrameType
from typing import TYPE_CHECKING

from groupbuy import __version__
from groupbuy.api import ACCESS_LOGGER
from groupbuy.api.accesslog import BufferedLineHandler, CachedTimeFormatter
from groupbuy.metrics import multiprocess_dir
from groupbuy.settings import Settings, SettingsError, load_settings
from groupbuy.storage.redis_client import describe

if TYPE_CHECKING:
    from groupbuy.api.server import HeadLimits

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
    from groupbuy.api.server import PortInUse, bind
    from groupbuy.storage.embedded import EngineError

    try:
        settings, generated = _settings_for_serve(args)
        _check_database(settings)
    except (SettingsError, OSError) as exc:
        print(f"groupbuy: {exc}", file=sys.stderr)
        return 2
    _configure_logging(settings)
    with _stopping_on_signals(), contextlib.ExitStack() as stack:
        # The port first: when it is taken, nothing else starts and nothing says "listening".
        try:
            sock = bind(settings.server.host, settings.server.port)
        except PortInUse as exc:
            print(f"groupbuy: {exc}", file=sys.stderr)
            return 1
        except OSError as exc:
            print(f"groupbuy: {exc}", file=sys.stderr)
            return 2
        stack.callback(sock.close)
        try:
            settings, redis_line = _redis_for_serve(settings, stack)
        except (SettingsError, EngineError, OSError) as exc:
            print(f"groupbuy: {exc}", file=sys.stderr)
            return 2
        if settings.redis.strict:
            # Refuse here, in one line, rather than from inside uvicorn's lifespan.
            try:
                asyncio.run(_check_redis(settings))
            except SettingsError as exc:
                print(f"groupbuy: {exc}", file=sys.stderr)
                return 2
        return _run_server(settings, sock, redis_line, generated)
    return 0  # stopped by a signal before the server ran


async def _check_redis(settings: Settings) -> None:
    """The start-up durability check on a client of its own (RedisNotDurable when strict);
    an unreachable Redis is left to the services' start, which reports it."""
    import redis.exceptions

    from groupbuy.storage.durability import check_durability, check_replicas
    from groupbuy.storage.redis_client import connect_redis

    client = connect_redis(settings.redis)
    try:
        with contextlib.suppress(redis.exceptions.ConnectionError, redis.exceptions.TimeoutError):
            await check_durability(client, describe(settings.redis), settings.redis.strict)
            await check_replicas(client, settings.redis)
    finally:
        await client.aclose()


def _check_database(settings: Settings) -> None:
    """Refuse (SettingsError) a database URL whose driver is missing, in one line, and say
    when a URL's scheme is read as its async driver."""
    from groupbuy.storage.db import missing_driver

    problem = missing_driver(settings.database.effective_url)
    if problem:
        raise SettingsError(problem)
    given = settings.database.url
    if given and given != settings.database.effective_url:
        logging.getLogger(__name__).info(
            "database URL %s:// is read as %s:// (the async driver)",
            given.partition("://")[0],
            settings.database.effective_url.partition("://")[0],
        )


def _banner(settings: Settings, port: int, redis_line: str, generated: str | None) -> None:
    """The start-up message: printed once the service really listens."""
    from groupbuy.storage.db import shown_url

    workers = settings.server.workers
    several = f" ({workers} workers)" if workers > 1 else ""
    print(f"groupbuy {__version__} listening on http://{settings.server.host}:{port}{several}")
    print(f"  redis:    {redis_line}")
    print(f"  database: {shown_url(settings.database.effective_url)}")
    if generated:
        print("  no API keys configured; a development admin key was generated for this run:")
        print(f"    export GROUPBUY_KEY={generated}")
        print('    curl -H "Authorization: Bearer $GROUPBUY_KEY" ...')
    else:
        print(
            "  API keys: from config.toml / GROUPBUY_API_KEYS; send 'Authorization: Bearer <key>'"
        )
    if settings.auth.signed_requests:
        print(
            "  signed requests: required of every key (X-Groupbuy-Timestamp, "
            f"X-Groupbuy-Signature; +-{settings.auth.signature_skew_s} s)"
        )
    sys.stdout.flush()


def _run_server(
    settings: Settings, sock: socket.socket, redis_line: str, generated: str | None
) -> int:
    """Serve with uvicorn (one worker or several) on the bound socket; the start-up message
    comes once the app has started and listens. Non-zero when it never did."""
    from groupbuy.api.app import create_app
    from groupbuy.api.server import AnnouncingServer, HeadLimits, ServerConfig

    port = sock.getsockname()[1]
    listening = False

    def announce() -> None:
        nonlocal listening
        listening = True
        _banner(settings, port, redis_line, generated)

    limits = HeadLimits.of(settings.server)
    if settings.server.workers > 1:
        # Each worker process builds its own app from the environment: hand it what this
        # process decided (the engine's socket, a generated key). The workers share their
        # metrics through files: the directory must be set before they start.
        os.environ["GROUPBUY_SERVER_WORKERS"] = str(settings.server.workers)
        os.environ["GROUPBUY_REDIS_URL"] = settings.redis.url
        os.environ["GROUPBUY_API_KEYS"] = ",".join(settings.auth.api_keys)
        with multiprocess_dir(needed=True):
            run_workers(
                "groupbuy.cli:app_from_environment",
                settings.server.host,
                port,
                settings.server.workers,
                head_limits=limits,
                sock=sock,
                on_listening=announce,
            )
    else:
        config = ServerConfig(
            create_app(settings),
            limits,
            host=settings.server.host,
            port=port,
            log_level="warning",
        )
        with contextlib.suppress(SystemExit):  # uvicorn's exit when the app fails to start
            AnnouncingServer(config, announce).run(sockets=[sock])
    if not listening:
        print("groupbuy: the service did not start (the error is above)", file=sys.stderr)
        return 3
    return 0


def run_workers(
    app_factory: str,
    host: str,
    port: int,
    workers: int,
    *,
    head_limits: HeadLimits | None = None,
    sock: socket.socket | None = None,
    on_listening: Callable[[], None] | None = None,
) -> None:
    """What uvicorn.run does for several workers, on one shared socket with TCP_NODELAY
    (groupbuy.api.server.bind), with our limits on request heads; `on_listening` runs once
    every worker has started its app and serves."""
    from groupbuy.api.server import AnnouncingMultiprocess, HeadLimits, ServerConfig, bind
    from groupbuy.settings import ServerSettings

    config = ServerConfig(
        app_factory,
        head_limits or HeadLimits.of(ServerSettings()),
        factory=True,
        host=host,
        port=port,
        workers=workers,
        log_level="warning",
    )
    AnnouncingMultiprocess(config, [sock or bind(host, port)], on_listening).run()


def worker(args: argparse.Namespace) -> int:
    """Run only the scheduler (records to SQL, sweeps, expiry, repair, reconcile) until stopped."""
    try:
        settings = load_settings(args.config)
        _check_database(settings)
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
    # A signal while the worker starts (imports, connections: seconds on a loaded machine)
    # is a clean stop too, not death by the default handler.
    with _stopping_on_signals():
        from groupbuy.storage.db import shown_url

        print(
            f"groupbuy {__version__} worker: redis {describe(settings.redis)}, "
            f"database {shown_url(settings.database.effective_url)}"
        )
        sys.stdout.flush()
        try:
            asyncio.run(_work(settings))
        except SettingsError as exc:  # [redis] strict and a Redis that could lose writes
            print(f"groupbuy: {exc}", file=sys.stderr)
            return 2
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
