"""Typed settings: config.toml, overridden by GROUPBUY_* environment variables."""

from __future__ import annotations

import dataclasses
import os
import tomllib
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROLES = ("service", "admin")


class SettingsError(ValueError):
    """A configuration value is unknown, mistyped or out of range."""


def _check_range(section: str, name: str, value: float, low: float, high: float) -> None:
    if not low <= value <= high:
        raise SettingsError(f"[{section}] {name} = {value!r} is outside {low}..{high}")


@dataclass(frozen=True)
class ServerSettings:
    """Where the HTTP API listens."""

    host: str = "127.0.0.1"
    port: int = 8000
    workers: int = 1
    max_body_bytes: int = 65536
    access_log_json: bool = False

    def __post_init__(self) -> None:
        _check_range("server", "port", self.port, 0, 65535)
        _check_range("server", "workers", self.workers, 1, 64)
        _check_range("server", "max_body_bytes", self.max_body_bytes, 1024, 16 * 1024 * 1024)


@dataclass(frozen=True)
class RedisSettings:
    """The Redis that holds the live state; an empty url means the embedded fakeredis."""

    url: str = ""
    key_prefix: str = "gb"
    socket_timeout_s: float = 5.0
    max_connections: int = 256

    def __post_init__(self) -> None:
        if not self.key_prefix or any(c in self.key_prefix for c in "{} "):
            raise SettingsError("[redis] key_prefix must be non-empty without braces or spaces")
        _check_range("redis", "socket_timeout_s", self.socket_timeout_s, 0.01, 600)
        _check_range("redis", "max_connections", self.max_connections, 1, 100_000)

    @property
    def embedded(self) -> bool:
        """True when the service runs on the in-process fakeredis server."""
        return not self.url


@dataclass(frozen=True)
class DatabaseSettings:
    """The SQL database that holds the durable record."""

    url: str = ""

    @property
    def effective_url(self) -> str:
        """The SQLAlchemy URL to use: the configured one or a SQLite file in the cwd."""
        return self.url or "sqlite+aiosqlite:///groupbuy.db"


@dataclass(frozen=True)
class ApiKey:
    """One bearer secret and the role it grants."""

    role: str
    secret: str = field(repr=False)


@dataclass(frozen=True)
class AuthSettings:
    """Bearer keys, each `role:secret`."""

    api_keys: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        for entry in self.api_keys:
            role, sep, secret = entry.partition(":")
            if not sep or role not in ROLES or not secret:
                raise SettingsError(
                    "[auth] api_keys entries must look like 'service:<secret>' or 'admin:<secret>'"
                )

    @property
    def keys(self) -> tuple[ApiKey, ...]:
        """The parsed keys."""
        return tuple(ApiKey(*entry.split(":", 1)) for entry in self.api_keys)


@dataclass(frozen=True)
class TeamSettings:
    """Defaults for activities that do not set their own values."""

    team_size: int = 3
    lock_ttl_s: int = 300
    team_deadline_s: int = 86400
    retention_s: int = 604800

    def __post_init__(self) -> None:
        _check_range("teams", "team_size", self.team_size, 2, 50)
        _check_range("teams", "lock_ttl_s", self.lock_ttl_s, 1, 86400)
        _check_range("teams", "team_deadline_s", self.team_deadline_s, 1, 2592000)
        _check_range("teams", "retention_s", self.retention_s, 1, 31_536_000)


@dataclass(frozen=True)
class RedPacketSettings:
    """Limits and defaults of red packets."""

    max_count: int = 10000
    max_amount_cents: int = 1000000
    expires_in_s: int = 86400
    retention_s: int = 604800
    reclaim_idle_s: float = 30.0

    def __post_init__(self) -> None:
        _check_range("redpackets", "max_count", self.max_count, 1, 100_000)
        _check_range("redpackets", "max_amount_cents", self.max_amount_cents, 1, 10**12)
        _check_range("redpackets", "expires_in_s", self.expires_in_s, 1, 604800)
        _check_range("redpackets", "retention_s", self.retention_s, 1, 31_536_000)
        _check_range("redpackets", "reclaim_idle_s", self.reclaim_idle_s, 0.0, 86400)


@dataclass(frozen=True)
class OutboxSettings:
    """How records travel from Redis to SQL."""

    flush_interval_s: float = 1.0
    batch_size: int = 500

    def __post_init__(self) -> None:
        _check_range("outbox", "flush_interval_s", self.flush_interval_s, 0.01, 3600)
        # a batch's ids go to one script call as ARGV; Lua's unpack() stops near 8000
        _check_range("outbox", "batch_size", self.batch_size, 1, 5000)


@dataclass(frozen=True)
class SchedulerSettings:
    """The scheduled jobs: how often each runs, and the lease that lets one process run them."""

    enabled: bool = True
    lease_ttl_s: float = 10.0
    sweep_interval_s: float = 1.0  # sweep_locks and expire_teams
    expire_packets_interval_s: float = 1.0
    repair_interval_s: float = 30.0
    reconcile_interval_s: float = 300.0
    sweep_batch: int = 200  # teams per index read; each team is one short script call

    def __post_init__(self) -> None:
        _check_range("scheduler", "lease_ttl_s", self.lease_ttl_s, 0.1, 3600)
        for name in (
            "sweep_interval_s",
            "expire_packets_interval_s",
            "repair_interval_s",
            "reconcile_interval_s",
        ):
            _check_range("scheduler", name, getattr(self, name), 0.01, 86400)
        _check_range("scheduler", "sweep_batch", self.sweep_batch, 1, 10_000)


@dataclass(frozen=True)
class Settings:
    """Every setting of the service, one frozen object."""

    server: ServerSettings = field(default_factory=ServerSettings)
    redis: RedisSettings = field(default_factory=RedisSettings)
    database: DatabaseSettings = field(default_factory=DatabaseSettings)
    auth: AuthSettings = field(default_factory=AuthSettings)
    teams: TeamSettings = field(default_factory=TeamSettings)
    redpackets: RedPacketSettings = field(default_factory=RedPacketSettings)
    outbox: OutboxSettings = field(default_factory=OutboxSettings)
    scheduler: SchedulerSettings = field(default_factory=SchedulerSettings)

    def replace(self, section: str, **values: Any) -> Settings:
        """A copy with some values of one section changed (CLI flags, tests)."""
        current = getattr(self, section)
        return dataclasses.replace(self, **{section: dataclasses.replace(current, **values)})


# Short names the product documents besides the systematic GROUPBUY_<SECTION>_<NAME>.
ENV_ALIASES = {"GROUPBUY_API_KEYS": ("auth", "api_keys")}


def _section_types() -> dict[str, type]:
    hints = typing.get_type_hints(Settings)
    return {f.name: hints[f.name] for f in dataclasses.fields(Settings)}


def _coerce(section: str, name: str, kind: Any, value: Any, from_env: bool) -> Any:
    where = f"[{section}] {name}"
    origin = typing.get_origin(kind)
    if origin is tuple:
        if from_env:
            return tuple(part.strip() for part in str(value).split(",") if part.strip())
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise SettingsError(f"{where} must be a list of strings")
        return tuple(value)
    if kind is bool:
        if from_env:
            lowered = str(value).strip().lower()
            if lowered in ("1", "true", "yes", "on"):
                return True
            if lowered in ("0", "false", "no", "off"):
                return False
            raise SettingsError(f"{where} must be true or false, got {value!r}")
        if not isinstance(value, bool):
            raise SettingsError(f"{where} must be true or false")
        return value
    if kind is int or kind is float:
        if from_env:
            try:
                value = kind(value)
            except ValueError:
                raise SettingsError(f"{where} must be a number, got {value!r}") from None
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise SettingsError(f"{where} must be a number")
        if kind is int and not isinstance(value, int):
            raise SettingsError(f"{where} must be an integer")
        return kind(value)
    if kind is str:
        if not isinstance(value, str):
            raise SettingsError(f"{where} must be a string")
        return value
    raise SettingsError(f"{where} has an unsupported type {kind!r}")  # pragma: no cover


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
            raw = tomllib.load(fh)
    sections = _section_types()
    unknown_sections = set(raw) - set(sections)
    if unknown_sections:
        raise SettingsError(f"unknown section(s) in {path}: {', '.join(sorted(unknown_sections))}")

    built: dict[str, Any] = {}
    for section, cls in sections.items():
        hints = typing.get_type_hints(cls)
        names = {f.name for f in dataclasses.fields(cls)}
        given = raw.get(section, {})
        if not isinstance(given, dict):
            raise SettingsError(f"[{section}] must be a table")
        unknown = set(given) - names
        if unknown:
            raise SettingsError(f"unknown key(s) in [{section}]: {', '.join(sorted(unknown))}")
        values = {n: _coerce(section, n, hints[n], v, False) for n, v in given.items()}
        for name in names:
            env_name = f"GROUPBUY_{section.upper()}_{name.upper()}"
            if env_name in environ:
                values[name] = _coerce(section, name, hints[name], environ[env_name], True)
        for alias, (alias_section, alias_name) in ENV_ALIASES.items():
            if alias_section == section and alias in environ:
                values[alias_name] = _coerce(
                    section, alias_name, hints[alias_name], environ[alias], True
                )
        built[section] = cls(**values)
    return Settings(**built)


__all__ = ["Settings", "SettingsError", "load_settings", "ApiKey", "ROLES"]
