"""The `groupbuy` command: `groupbuy serve` runs the HTTP API (and, in the same process, the
scheduled jobs); `groupbuy worker` runs only the scheduled jobs, beside a service elsewhere;
`groupbuy demo` plays a small flash sale against a running service."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import ipaddress
import logging
import os
import secrets
import signal
import socket
import sys
import textwrap
import threading
from collections.abc import Callable, Coroutine, Iterator, Sequence
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Any, TypeVar

from groupbuy import __version__
from groupbuy.api.logformat import configure_logging, flush_logs
from groupbuy.metrics import multiprocess_dir
from groupbuy.settings import LogSettings, Settings, SettingsError, load_settings
from groupbuy.storage.redis_client import describe

if TYPE_CHECKING:
    from groupbuy.api.server import HeadLimits
    from groupbuy.storage.db import Database

T = TypeVar("T")


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
        if not _loopback(settings.server.host):
            raise SettingsError(
                f"serving on {settings.server.host} (beyond this machine) needs API keys of "
                "your own: set GROUPBUY_API_KEYS (the development key is for loopback only)"
            )
        generated = _development_key(Path(settings.embedded.data_dir))
        settings = settings.replace("auth", api_keys=(f"admin:{generated}",))
    return settings, generated


DEV_KEY_FILE = "dev-admin-key"
"""The file in the data directory that keeps the generated development admin key."""


def _development_key(data_dir: Path) -> str:
    """The development admin key kept in `data_dir` (owner-only), made on the first start:
    the same key after a restart, so an exported GROUPBUY_KEY keeps working."""
    path = data_dir / DEV_KEY_FILE
    with contextlib.suppress(FileNotFoundError):
        kept = path.read_text().strip()
        if kept:
            os.chmod(path, 0o600)  # an older or copied file: owner-only again
            return kept
    data_dir.mkdir(parents=True, exist_ok=True)
    key = f"dev-{secrets.token_urlsafe(24)}"
    # Created owner-only: the key never sits in a file others may read, not even briefly.
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(key + "\n")
    return key


def _loopback(host: str) -> bool:
    """True for an address only this machine reaches (127.0.0.0/8, ::1, localhost)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


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
        _configure_logging(settings)
        _check_database(settings)
    except (SettingsError, OSError) as exc:
        print(f"groupbuy: {exc}", file=sys.stderr)
        return 2
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
        status = _run_server(settings, sock, redis_line, generated, args.config)
        if status:
            return status
    # Here after a signal (the server's, or one before it ran) and everything stopped.
    _say_stopped()
    return 0


def _say_stopped() -> None:
    """The last line of a clean stop, after every part (server, engine, jobs) has ended."""
    flush_logs()  # the access lines of the last requests come before it
    print(f"groupbuy {__version__} stopped")
    sys.stdout.flush()


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
        _configure_logging(settings)
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


def _missing_sqlite_file(settings: Settings) -> bool:
    """True when the database is a SQLite file that does not exist yet."""
    from groupbuy.storage.db import sqlite_path

    path = sqlite_path(settings.database.effective_url)
    return path is not None and not os.path.exists(path)


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
    base = f"http://{_url_host(settings.server.host)}:{port}"
    print(f"groupbuy {__version__} listening on {base}{several}")
    print(f"  home:     {base}/  (what runs here)")
    print(f"  API docs: {base}/docs")
    print(f"  redis:    {redis_line}")
    print(f"  database: {shown_url(settings.database.effective_url)}")
    if generated:
        key_file = os.path.abspath(os.path.join(settings.embedded.data_dir, DEV_KEY_FILE))
        print(f"  no API keys configured; the development admin key (kept in {key_file}):")
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


def _url_host(host: str) -> str:
    """The host as a URL writes it: an IPv6 address in brackets."""
    return f"[{host}]" if ":" in host else host


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
                keep_alive_s=settings.server.keep_alive_s,
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
            timeout_keep_alive=settings.server.keep_alive_s,
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
    keep_alive_s: float | None = None,
    sock: socket.socket | None = None,
    on_listening: Callable[[], None] | None = None,
) -> bool:
    """What uvicorn.run does for several workers, on one shared socket with TCP_NODELAY
    (groupbuy.api.server.bind), with our limits on request heads and on idle connections
    (`keep_alive_s`, [server]'s default when None); `on_listening` runs once
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
        timeout_keep_alive=keep_alive_s or ServerSettings().keep_alive_s,
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
    _say_stopped()
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
    from groupbuy.storage.db import shown_url

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
    missing = _missing_sqlite_file(settings)
    if args.db_command == "current" and missing:
        # Read without creating: opening the file would leave an empty groupbuy.db behind.
        print(
            f"none: {shown_url(settings.database.effective_url)}: no database file yet; "
            f"`groupbuy serve` creates it at {migrations.head()}"
        )
        return 1 if args.check else 0
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
            if database.is_sqlite and found.known and found.revision != migrations.head():
                # Behind or empty: `groupbuy serve` upgrades SQLite itself at start.
                problem = f"`groupbuy serve` upgrades it to {migrations.head()} at start"
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
    """Every line to stderr as [log] says: its level, format and access lines."""
    configure_logging(settings.log.level, settings.log.access_log, settings.log.format)


_CONFIGURATION_HELP = """\
configuration:
  Settings come from config.toml (--config, else $GROUPBUY_CONFIG, else ./config.toml
  when present, else the built-in defaults), then from environment variables named
  GROUPBUY_<SECTION>_<NAME> for the key <name> of the section [<section>], which win
  over the file (e.g. GROUPBUY_SERVER_PORT=9000). A GROUPBUY_* variable that resembles
  a setting but is none (a misspelling) stops the command with exit status 2; an
  unknown key in config.toml too. The main ones:
    GROUPBUY_REDIS_URL        redis://host:port/db or unix:///path; unset: the embedded
                              engine, kept in GROUPBUY_EMBEDDED_DATA_DIR
    GROUPBUY_DATABASE_URL     sqlite+aiosqlite:///path.db or postgresql+asyncpg://...;
                              unset: ./groupbuy.db
    GROUPBUY_API_KEYS         role:secret[,role:secret...], role service, admin or viewer;
                              unset: serve uses a development admin key kept in the data
                              directory (loopback only)
    GROUPBUY_SERVER_HOST, GROUPBUY_SERVER_PORT, GROUPBUY_SERVER_WORKERS
                              what serve's --host, --port and --workers set
    GROUPBUY_LOG_LEVEL, GROUPBUY_LOG_FORMAT, GROUPBUY_LOG_ACCESS_LOG
                              debug|info|warning|error, text|json, true|false
"""
_SEE_CONFIGURATION = "Settings and their variables: `groupbuy --help`.\n"

_SERVE_HELP = (
    "Serve the HTTP API with uvicorn until SIGINT or SIGTERM. Each process also runs the "
    "scheduled jobs when it holds the scheduler lease. Flags override [server] settings. "
    "On PostgreSQL the database must be at this version's schema revision (run `groupbuy "
    "db upgrade` first); the SQLite default upgrades itself at start."
)
_SERVE_EPILOG = (
    _SEE_CONFIGURATION
    + """exit status: 0 after a signal, 2 for a configuration error (the database schema not at
this version's revision included), 1 when the port is in use, 3 when the service did not
start (the database could not be reached, or a worker failed to start; the reason is above).
"""
)
_WORKER_HELP = (
    "Run only the scheduled jobs (records to SQL, sweeps, expiry, repair, reconcile) until "
    "SIGINT or SIGTERM, beside `groupbuy serve` processes that run with "
    "GROUPBUY_SCHEDULER_ENABLED=false or compete for the same lease. With no "
    "GROUPBUY_REDIS_URL the worker attaches to the engine a running `groupbuy serve` keeps "
    "in the same GROUPBUY_EMBEDDED_DATA_DIR."
)
_WORKER_EPILOG = (
    _SEE_CONFIGURATION
    + """exit status: 0 after a signal, 2 for a configuration error (the database schema not at
this version's revision included).
"""
)
_DB_HELP = (
    "The schema's migrations, shipped inside the package (Alembic): upgrade the database "
    "named by GROUPBUY_DATABASE_URL / [database] url, or say where it stands. Run "
    "`groupbuy db upgrade` before starting a new version on PostgreSQL; `groupbuy serve` "
    "upgrades SQLite itself. A database made by versions before migrations (tables, no "
    "alembic_version) is checked against revision 0001 and stamped with it by `upgrade`."
)
_DB_EPILOG = (
    _SEE_CONFIGURATION
    + """exit status: 0 on success, 1 when the database cannot be reached or a migration failed
(`current --check`: also when the schema is not at this version's revision), 2 for a
configuration error or a schema that cannot be adopted.
"""
)
_DB_STEPS = {
    "upgrade": "apply the migrations up to REVISION (default: head)",
    "downgrade": "undo the migrations down to REVISION ('base': no tables at all)",
    "current": "the database's revision, and whether it is current (never creates it)",
    "history": "the revisions this version ships, newest first",
    "revision": "for developers: write a new revision file into the package",
}
_DEMO_HELP = (
    "Play a small flash sale against a running service, at most --rate requests/s for "
    "--duration seconds: shoppers lock seats, most pay, some abandon, some wait in line; "
    "a red-packet storm; a webhook receiver on 127.0.0.1 verifies every delivery. It prints "
    "a line a second and a summary, then removes the webhook endpoint it registered. "
    "Ctrl-C stops it early, cleanly."
)
_DEMO_EPILOG = """\
Webhooks need the service started with GROUPBUY_WEBHOOKS_ALLOW_HTTP=true and
GROUPBUY_WEBHOOKS_ALLOW_PRIVATE_NETWORKS=true (development only); without them the sale
runs without webhooks.
exit status: 0 once the demo ended (its time was up, or Ctrl-C), 1 when the service could
not be reached, 2 for wrong options or a set-up the service refused (it needs an admin key).
"""
_CONFIG_HELP = "path to config.toml (default: $GROUPBUY_CONFIG or ./config.toml)"


def _paragraph(text: str) -> str:
    """One paragraph wrapped for an 80-column terminal (the epilogs keep their own lines)."""
    return textwrap.fill(text, width=79)


def _options() -> argparse.ArgumentParser:
    """The options every command takes, before or after its subcommand: given at one
    level they are not reset by another (SUPPRESS: no default written there)."""
    options = argparse.ArgumentParser(add_help=False)
    options.add_argument("--config", default=argparse.SUPPRESS, help=_CONFIG_HELP)
    return options


def _command(commands: Any, name: str, summary: str, about: str, epilog: str) -> Any:
    """A subcommand's parser: its summary in the list, its paragraph, its epilog as written."""
    return commands.add_parser(
        name,
        help=summary,
        description=_paragraph(about),
        epilog=epilog,
        parents=[_options()],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )


def _add_db_parser(commands: Any) -> None:
    """`groupbuy db ...` and its subcommands."""
    schema = _command(
        commands,
        "db",
        "the database schema's migrations: " + ", ".join(_DB_STEPS),
        _DB_HELP,
        _DB_EPILOG,
    )
    schema.set_defaults(func=db)
    steps = schema.add_subparsers(
        dest="db_command", required=True, metavar="{" + ",".join(_DB_STEPS) + "}"
    )
    step = {
        name: steps.add_parser(
            name,
            help=about,
            description=_paragraph(about[0].upper() + about[1:] + "."),
            parents=[_options()],
        )
        for name, about in _DB_STEPS.items()
    }
    step["upgrade"].add_argument(
        "revision", nargs="?", default="head", help="target revision (default head)"
    )
    step["downgrade"].add_argument("revision", help="target revision, or base")
    step["current"].add_argument(
        "--check",
        action="store_true",
        help="exit 1 unless the schema is at this version's revision",
    )
    step["revision"].add_argument("-m", "--message", required=True, help="what it changes")
    step["revision"].add_argument(
        "--autogenerate",
        action="store_true",
        help="fill it with the differences between the models and the database (at head)",
    )


def demo(args: argparse.Namespace) -> int:
    """Play the demo sale against --url (groupbuy.demo)."""
    from groupbuy.demo.plan import DemoOptions
    from groupbuy.demo.runner import main as play

    options = DemoOptions(
        url=args.url.rstrip("/"),
        key=args.key or os.environ.get("GROUPBUY_KEY", ""),
        duration_s=args.duration,
        rate=args.rate,
        seed=args.seed,
        sign=args.sign,
        summary_path=args.summary,
    )
    return play(options)


def _add_demo_parser(commands: Any) -> None:
    """`groupbuy demo`: a client of a running service, so no --config of its own."""
    from groupbuy.demo.plan import DEFAULT_DURATION_S, DEFAULT_RATE, DEFAULT_URL

    play = commands.add_parser(
        "demo",
        help="play a small flash sale against a running service",
        description=_paragraph(_DEMO_HELP),
        epilog=_DEMO_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    play.add_argument("--url", default=DEFAULT_URL, help=f"the service (default {DEFAULT_URL})")
    play.add_argument("--key", help="an admin key's secret (default: $GROUPBUY_KEY)")
    play.add_argument(
        "--duration",
        type=float,
        default=DEFAULT_DURATION_S,
        help=f"seconds of sale at most (default {DEFAULT_DURATION_S:g})",
    )
    play.add_argument(
        "--rate",
        type=float,
        default=DEFAULT_RATE,
        help=f"requests/s at most (default {DEFAULT_RATE:g})",
    )
    play.add_argument("--seed", type=int, help="the shoppers' choices repeat with the same seed")
    play.add_argument(
        "--sign", action="store_true", help="sign each request (a service with signed_requests)"
    )
    play.add_argument("--summary", type=Path, help="also write the summary as JSON to this file")
    play.set_defaults(func=demo)


def _parser() -> argparse.ArgumentParser:
    """The whole command line: `groupbuy [--config C] serve|worker|db|demo ...`."""
    parser = argparse.ArgumentParser(
        prog="groupbuy",
        description=_paragraph(" ".join(str(__doc__).split())),
        epilog=_CONFIGURATION_HELP
        + "Run `groupbuy <command> --help` for a command's options and exit status.\n",
        parents=[_options()],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.set_defaults(config=None)
    parser.add_argument("--version", action="version", version=f"groupbuy {__version__}")
    commands = parser.add_subparsers(
        dest="command", required=True, metavar="{serve,worker,db,demo}"
    )
    run = _command(commands, "serve", "run the HTTP API", _SERVE_HELP, _SERVE_EPILOG)
    run.add_argument("--host", help="interface to listen on (default from config)")
    run.add_argument("--port", type=int, help="port to listen on (default from config)")
    run.add_argument("--workers", type=int, help="worker processes (default from config)")
    run.set_defaults(func=serve)
    work = _command(
        commands,
        "worker",
        "run the scheduled jobs alone (records to SQL, sweeps, expiry, repair)",
        _WORKER_HELP,
        _WORKER_EPILOG,
    )
    work.set_defaults(func=worker)
    _add_db_parser(commands)
    _add_demo_parser(commands)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the `groupbuy` console script."""
    args = _parser().parse_args(argv)
    # Until the settings are read (their own warnings included): the defaults of [log].
    defaults = LogSettings()
    configure_logging(defaults.level, defaults.access_log, defaults.format)
    return int(args.func(args))


if __name__ == "__main__":
    raise SystemExit(main())
