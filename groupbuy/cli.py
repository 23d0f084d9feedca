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
import threading
from collections.abc import Callable, Coroutine, Iterator, Sequence
from types import FrameType
from typing import TYPE_CHECKING, Any, TypeVar

from groupbuy import __version__
from groupbuy.api import ACCESS_LOGGER
from groupbuy.api.accesslog import BufferedLineHandler, CachedTimeFormatter
from groupbuy.metrics import multiprocess_dir
from groupbuy.settings import Settings, SettingsError, load_settings
from groupbuy.storage.redis_client import describe

if TYPE_CHECKING:
    from groupbuy.api.server import HeadLimits
    from groupbuy.storage.db import Database

T = TypeVar("T")

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
        # The schema before any worker starts: SQLite upgrades here, once; PostgreSQL must
        # already be at this version's revision (`groupbuy db upgrade`).
        status = _prepare_schema(settings)
        if status:
            return status
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
        return _run_server(settings, sock, redis_line, generated, args.config)
    return 0  # stopped by a signal before the server ran


async def _check_redis(settings: Settings) -> None:
    """The start-up durability check on a client of its own (RedisNotDurable when strict);
    an unreachable Redis is left to the services' start, which reports it."""
    from groupbuy.storage.durability import check_redis
    from groupbuy.storage.reachability import unreachable
    from groupbuy.storage.redis_client import connect_redis

    client = connect_redis(settings.redis)
    try:
        await check_redis(client, settings.redis, describe(settings.redis))
    except Exception as error:
        if not unreachable(error):
            raise
    finally:
        await client.aclose()


def _checked_settings(args: argparse.Namespace) -> Settings | None:
    """The settings of `--config` and the environment with a usable database driver, or None
    after one line saying why not (the caller exits 2)."""
    try:
        settings = load_settings(args.config)
        _check_database(settings)
    except (SettingsError, OSError) as exc:
        print(f"groupbuy: {exc}", file=sys.stderr)
        return None
    return settings


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


def _prepare_schema(settings: Settings) -> int:
    """Bring the schema to this version's revision (SQLite) or check it is there: 0, or the
    exit status after a one-line message (2: the schema is not current; 3: the database
    could not be reached or the upgrade failed)."""
    from groupbuy import migrations
    from groupbuy.storage.db import Database

    async def prepare() -> None:
        database = Database(settings.database.effective_url, settings.database.timeout_s)
        try:
            await migrations.prepare(database)
        finally:
            await database.dispose()

    try:
        _run_on_database(prepare)
    except migrations.SchemaNotCurrent as exc:
        print(f"groupbuy: {exc}", file=sys.stderr)
        return 2
    except Exception as exc:  # unreachable, refused, a failed migration: one line, no trace
        print(
            f"groupbuy: the service did not start: {_database_failure(settings, exc)}",
            file=sys.stderr,
        )
        return 3
    return 0


def _run_on_database(work: Callable[[], Coroutine[Any, Any, T]]) -> T:
    """asyncio.run(work()), letting SQLite's connection threads end before the loop closes
    when it fails: aiosqlite stops the thread of a connection that could not open without
    waiting for it, and the thread then answers a closed loop (a traceback on stderr)."""

    async def run() -> T:
        try:
            return await work()
        except BaseException:
            await asyncio.to_thread(_join_sqlite_threads)
            raise

    return asyncio.run(run())


def _join_sqlite_threads() -> None:
    for thread in threading.enumerate():
        if thread.name.endswith("(_connection_worker_thread)"):
            thread.join(timeout=2)


def _database_failure(settings: Settings, exc: BaseException) -> str:
    """One line about a database operation that failed: where, and the driver's reason."""
    from groupbuy.storage.db import shown_url

    reason = str(getattr(exc, "orig", None) or exc).strip().splitlines()
    first = reason[0] if reason else type(exc).__name__
    return f"database {shown_url(settings.database.effective_url)}: {first}"


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
    settings: Settings,
    sock: socket.socket,
    redis_line: str,
    generated: str | None,
    config_path: str | None = None,
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
    workers_started = True
    if settings.server.workers > 1:
        # Each worker process builds its own app from the environment: hand it what this
        # process decided (the engine's socket, a generated key). The workers share their
        # metrics through files: the directory must be set before they start.
        os.environ["GROUPBUY_SERVER_WORKERS"] = str(settings.server.workers)
        os.environ["GROUPBUY_REDIS_URL"] = settings.redis.url
        os.environ["GROUPBUY_API_KEYS"] = ",".join(settings.auth.api_keys)
        if config_path:  # --config: the workers read the same file, not $GROUPBUY_CONFIG's
            os.environ["GROUPBUY_CONFIG"] = os.path.abspath(config_path)
        with multiprocess_dir(needed=True):
            workers_started = run_workers(
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
    if not workers_started:
        print(
            "groupbuy: a worker that replaced one that died could not start (the error is "
            "above): the service stopped",
            file=sys.stderr,
        )
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
) -> bool:
    """What uvicorn.run does for several workers, on one shared socket with TCP_NODELAY
    (groupbuy.api.server.bind), with our limits on request heads; `on_listening` runs once
    every worker has started its app and serves. False when a worker failed to start (at
    first, or replacing one that died), which stopped them all."""
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
    supervisor = AnnouncingMultiprocess(config, [sock or bind(host, port)], on_listening)
    supervisor.run()
    return not supervisor.failed_start


def worker(args: argparse.Namespace) -> int:
    """Run only the scheduler (records to SQL, sweeps, expiry, repair, reconcile) until stopped."""
    settings = _checked_settings(args)
    if settings is None:
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


def db(args: argparse.Namespace) -> int:
    """`groupbuy db upgrade|downgrade|current|history|revision`: the schema's migrations."""
    from groupbuy import migrations

    if args.db_command == "history":
        for revision in reversed(migrations.history()):
            head = " (head)" if revision.revision == migrations.head() else ""
            print(
                f"{revision.down_revision or '<base>'} -> {revision.revision}{head}: "
                f"{revision.summary}"
            )
        return 0
    settings = _checked_settings(args)
    if settings is None:
        return 2
    try:
        return _run_on_database(lambda: _db(args, settings))
    except migrations.SchemaNotCurrent as exc:
        print(f"groupbuy: {exc}", file=sys.stderr)
        return 2
    except Exception as exc:  # unreachable, refused, a failed migration: one line, no trace
        print(f"groupbuy: {_database_failure(settings, exc)}", file=sys.stderr)
        return 1


async def _db(args: argparse.Namespace, settings: Settings) -> int:
    from groupbuy import migrations
    from groupbuy.storage.db import Database, shown_url

    where = shown_url(settings.database.effective_url)
    database = Database(settings.database.effective_url, settings.database.timeout_s)
    try:
        if args.db_command == "current":
            found = await migrations.state(database)
            problem = found.problem()
            shown = found.revision or "none"
            if problem is None:
                print(f"{shown} (head): {where}")
                return 0
            print(f"{shown}: {where}: {problem}")
            return 1 if args.check else 0
        if args.db_command == "upgrade":
            moved = await migrations.upgrade(database, args.revision)
        elif args.db_command == "downgrade":
            moved = await migrations.downgrade(database, args.revision)
        else:
            return await _new_revision(args, database)
    finally:
        await database.dispose()
    if moved.adopted:
        print(
            f"database {where}: tables made before migrations, checked and stamped "
            f"{migrations.BASELINE}; now at {moved.after}"
        )
    elif moved.before == moved.after:
        print(f"database {where}: already at {moved.after or 'base'}")
    else:
        print(
            f"database {where}: {args.db_command}d from {moved.before or 'base'} "
            f"to {moved.after or 'base'}"
        )
    return 0


async def _new_revision(args: argparse.Namespace, database: Database) -> int:
    """Write a new revision file into the package (for developers), compared with the
    database when --autogenerate (which must then be at head)."""
    from alembic import command

    from groupbuy import migrations

    def write(connection: Any) -> Any:
        config = migrations.alembic_config()
        config.attributes["connection"] = connection
        return command.revision(
            config,
            message=args.message,
            autogenerate=args.autogenerate,
            rev_id=migrations.next_revision_id(),
        )

    async with database.engine.begin() as connection:
        script = await connection.run_sync(write)
    print(f"wrote {script.path}")
    return 0


def app_from_environment() -> object:
    """An app built from config.toml and GROUPBUY_* (for multi-worker uvicorn)."""
    from groupbuy.api.app import create_app

    settings = load_settings()
    _configure_logging(settings)  # a spawned worker does not inherit the parent's logging
    return create_app(settings)


def _configure_logging(settings: Settings) -> None:
    """Log INFO and up to stderr; with access_log_json each access line is bare JSON."""
    logging.basicConfig(level=logging.INFO, format=_LOG_FORMAT)  # no-op once configured
    logging.getLogger("alembic").setLevel(logging.WARNING)  # its set-up chatter at INFO
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
  On PostgreSQL the database must be at this version's schema revision (run
  `groupbuy db upgrade` first); the SQLite default upgrades itself at start.
exit status: 0 after a signal, 2 for a configuration error (the database schema not at
this version's revision included), 1 when the port is in use, 3 when the service did not
start (the database could not be reached, or a worker failed to start; the reason is above).
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
exit status: 0 after a signal, 2 for a configuration error (the database schema not at
this version's revision included).
"""
)
_DB_HELP = (
    "The schema's migrations, shipped inside the package (Alembic): upgrade the database "
    "named by GROUPBUY_DATABASE_URL / [database] url, or say where it stands. Run "
    "`groupbuy db upgrade` before starting a new version on PostgreSQL."
)
_DB_EPILOG = (
    _CONFIGURATION_HELP
    + """  A database made by versions before migrations (tables, no alembic_version) is
  checked against revision 0001 and stamped with it by `upgrade`.
exit status: 0 on success, 1 when the database cannot be reached or a migration failed
(`current --check`: also when the schema is not at this version's revision), 2 for a
configuration error or a schema that cannot be adopted.
"""
)


def _add_db_parser(commands: Any) -> None:
    """`groupbuy db ...` and its subcommands."""
    schema = commands.add_parser(
        "db",
        help="the database schema's migrations (upgrade, current, history)",
        description=_DB_HELP,
        epilog=_DB_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    config_help = "path to config.toml (default: $GROUPBUY_CONFIG or ./config.toml)"
    schema.set_defaults(func=db)
    steps = schema.add_subparsers(dest="db_command", required=True)
    up = steps.add_parser("upgrade", help="apply the migrations up to REVISION (default: head)")
    up.add_argument("revision", nargs="?", default="head", help="target revision (default head)")
    down = steps.add_parser(
        "downgrade", help="undo the migrations down to REVISION ('base': no tables at all)"
    )
    down.add_argument("revision", help="target revision, or base")
    now = steps.add_parser("current", help="the database's revision, and whether it is current")
    now.add_argument(
        "--check",
        action="store_true",
        help="exit 1 unless the schema is at this version's revision",
    )
    steps.add_parser("history", help="the revisions this version ships, newest first")
    new = steps.add_parser(
        "revision", help="write a new revision file into the package (for developers)"
    )
    new.add_argument("-m", "--message", required=True, help="what the revision changes")
    new.add_argument(
        "--autogenerate",
        action="store_true",
        help="fill it with the differences between the models and the database (at head)",
    )
    for step in (up, down, now, new):
        step.add_argument("--config", help=config_help)


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
    _add_db_parser(commands)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format=_LOG_FORMAT)
    # Alembic says at INFO how it sets itself up each time; the commands say the outcome.
    logging.getLogger("alembic").setLevel(logging.WARNING)
    return int(args.func(args))


if __name__ == "__main__":
    raise SystemExit(main())
