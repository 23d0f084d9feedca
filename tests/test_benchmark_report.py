"""The benchmark's own logic: ratios and the Markdown built from rows, interleaved
comparisons, the grading of seat-lock rounds and the open-loop generator's clock."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from benchmarks.engine.versus import grade_locks
from benchmarks.harness import Trial, comparison, merge_correct, rotation, run_sync
from benchmarks.openloop import mixed_workload, request_builder, run
from benchmarks.run import confirm_targets, markdown, ratios
from groupbuy.redpacket.codec import grab_credit_key
from tests.support.joins import Tap, grade_joins


def _row(
    scenario: str, level: str, impl: str, ops_per_s: float, **extra: object
) -> dict[str, object]:
    return {
        "scenario": scenario,
        "level": level,
        "implementation": impl,
        "ops": 100,
        "seconds": 1.0,
        "ops_per_s": ops_per_s,
        "p50_ms": 1.0,
        "p95_ms": 2.0,
        "p99_ms": 3.0,
        "correct": {"duplicates": 0},
        "latencies_ms": [],
        "note": "",
        **extra,
    }


def _trials(*rates: float) -> list[Trial]:
    return [Trial(int(rate), 1.0, {}) for rate in rates]


ROWS = [
    _row("flash_grab", "engine", "groupbuy", 5000),
    _row("flash_grab", "http", "groupbuy (1 worker)", 2000),
    _row("flash_grab", "http", "bare starlette + 1 redis call (1 worker)", 4000),
    _row("grab @ half max rate", "engine", "groupbuy", 100, p99_ms=12.5),
    _row(
        "lock @ 80% max rate",
        "http",
        "groupbuy (1 worker)",
        100,
        p99_ms=30.0,
        correct={"generator_kept_up": False},
    ),
    _row(
        "grab @ half max rate",
        "http",
        "groupbuy (1 worker)",
        100,
        p99_ms=15.0,
        correct={"generator_kept_up": True, "generator_on_time": False},
        generator={"issue_late_p99_ms": 7.5},
    ),
    comparison(
        "engine_grab_vs_seed", "engine grab / peer", _trials(30, 20, 25), _trials(10) * 3, 2.0
    ),
    comparison(
        "http_grab_embedded_vs_redis_1",
        "HTTP grab, 1 worker: embedded engine / redis-server",
        _trials(96, 90),
        _trials(100, 100),
        0.9,
    ),
    comparison(
        "write_behind_vs_raw_sqlite",
        "write-behind drain / raw sqlite3, SQLite",
        _trials(10, 10),
        _trials(40, 20),
        0.5,
    ),
]


def test_ratios_show_interleaved_medians_and_p99_targets() -> None:
    found = {what: (figure, target, met) for what, figure, target, met in ratios(ROWS)}
    assert found["engine grab / peer"] == ("2.50x (2.00x–3.00x, 3 rounds)", ">= 2.00x", "yes")
    assert found["write-behind drain / raw sqlite3, SQLite"] == (
        "0.38x (0.25x–0.50x, 2 rounds)",
        ">= 0.50x",
        "no",
    )
    assert found["HTTP grab, 1 worker: embedded engine / redis-server"] == (
        "0.93x (0.90x–0.96x, 2 rounds)",
        ">= 0.90x",
        "yes",
    )
    p99 = "p99 offered at {} the maximum rate (open loop)"
    assert found["engine grab " + p99.format("half")] == ("12.5 ms", "<= 20 ms", "yes")
    assert found["http lock " + p99.format("80%")] == (
        "30.0 ms (the generator fell behind: less load than asked)",
        "<= 50 ms",
        "yes",
    )
    assert found["http grab " + p99.format("half")] == (
        "15.0 ms (incl. generator delays, p99 7.5 ms)",
        "<= 20 ms",
        "yes",
    )
    assert found["engine lock " + p99.format("80%")] == ("n/a", "<= 50 ms", "–")


def test_markdown_lists_rows_ratios_and_correctness_but_not_comparison_rows() -> None:
    text = markdown(ROWS, {"quick": True, "date": "today", "machine": "here"})
    assert "| flash_grab | engine | groupbuy | 100 | 5,000 |" in text
    assert "| engine grab / peer | 2.50x (2.00x–3.00x, 3 rounds) | >= 2.00x | yes |" in text
    assert "duplicates 0" in text and "benchmarks-latency.png" in text
    assert "| None |" not in text and "engine_grab_vs_seed" not in text


def test_each_round_rotates_the_contenders_and_the_warm_up_is_dropped() -> None:
    assert [rotation(["a", "b"], i) for i in range(3)] == [["a", "b"], ["b", "a"], ["a", "b"]]
    assert rotation(["a", "b", "c"], 1) == ["b", "c", "a"]
    order: list[tuple[str, int]] = []

    def contender(name: str, rate: float) -> Callable[[int], Trial]:
        def trial(index: int) -> Trial:
            order.append((name, index))
            return Trial(int(rate), 1.0, {"ok": True})

        return trial

    trials = run_sync({"a": contender("a", 10), "b": contender("b", 5)}, 2, say=lambda _m: None)
    assert order == [("a", 0), ("b", 0), ("b", 1), ("a", 1), ("a", 2), ("b", 2)]
    assert [len(t) for t in trials.values()] == [2, 2]


def test_a_comparison_is_the_median_of_same_round_ratios() -> None:
    # The machine halves its speed in round 2: per-round ratios stay 2x; pooled rates would not.
    row = comparison("k", "a / b", _trials(200, 100, 200), _trials(100, 50, 100), 2.0)
    assert (row["median"], row["min"], row["max"], row["met"]) == (2.0, 2.0, 2.0, True)
    below = comparison("k", "a / b", _trials(150, 100), _trials(100, 100), 1.5)
    assert below["median"] == 1.25 and below["met"] is False
    assert comparison("k", "a / b", _trials(1), _trials(1), None)["met"] is None


def test_correctness_of_rounds_adds_up_and_a_failed_round_stays_failed() -> None:
    merged = merge_correct(
        [
            {"winners": 2, "ok": True, "outcomes": {"locked": 2}},
            {"winners": 3, "ok": False, "outcomes": {"locked": 1, "team_full": 4}},
        ]
    )
    assert merged == {"winners": 5, "ok": False, "outcomes": {"locked": 3, "team_full": 4}}


def test_lock_grading_finds_overfull_teams_double_holders_and_undue_refusals() -> None:
    answers = [
        ("t1", "u1", "locked"),
        ("t1", "u2", "locked"),
        ("t2", "u3", "locked"),
        ("t2", "u4", "team_full"),  # t2 ends with a free seat: not due
        ("t1", "u5", "locked"),  # not in t1 at the end: lost
        ("t2", "u6", "too_many_people"),
    ]
    held = {"t1": ["u1", "u2", "u3"], "t2": ["u3"]}
    graded = grade_locks(answers, held, seats=2)
    assert graded["over_capacity"] == 1
    assert graded["duplicates"] == 1
    assert graded["lost_locks"] == 1
    assert graded["spurious_failures"] == 2
    clean = grade_locks([("t1", "u1", "locked"), ("t1", "u2", "team_full")], {"t1": ["u1"]}, 1)
    assert (clean["over_capacity"], clean["duplicates"], clean["spurious_failures"]) == (0, 0, 0)


async def test_open_loop_latency_counts_from_when_each_request_was_due() -> None:
    """A server that stalls 300 ms once: requests due during the stall queue behind it on
    the one connection, and their latency includes the wait (no coordinated omission)."""
    stalled = asyncio.Event()

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = int(head.lower().split(b"content-length:")[1].split(b"\r\n")[0])
                await reader.readexactly(length)
                if not stalled.is_set():
                    stalled.set()
                    await asyncio.sleep(0.3)
                body = b'{"status":"grabbed"}'
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass  # the generator closed its connection
        finally:
            writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    build = request_builder("grab", "key", "t", ["p1"])
    began = time.perf_counter()
    try:
        result = await run(f"http://127.0.0.1:{port}", 100.0, 1.0, 1, build)
    finally:
        server.close()
        await server.wait_closed()
    assert result["answered"] == result["requests"] == 100
    assert result["grabbed"] == 100 and result["statuses"] == {"200": 100}
    # the first request waited 300 ms; the ~30 due behind it waited up to as long
    assert result["max_ms"] >= 290
    assert sorted(result["latencies_ms"])[-25] >= 50
    assert result["waited_for_connection"] >= 25
    assert time.perf_counter() - began < 5


async def test_mixed_open_loop_confirms_each_lock_30_ms_after_its_answer() -> None:
    """Two grabs for every lock; each lock answered 201 is confirmed (same user, same
    team) no sooner than 30 ms after its answer, and latencies are kept per kind."""
    seen: list[tuple[float, str, bytes]] = []

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = int(head.lower().split(b"content-length:")[1].split(b"\r\n")[0])
                body = await reader.readexactly(length)
                path = head.split(b" ")[1].decode()
                seen.append((time.perf_counter(), path, body))
                # every other lock is refused: no confirm may follow it
                refused = path.endswith("/locks") and len(seen) % 2 == 0
                status = b"409 Conflict" if refused else b"201 Created"
                answer = b'{"status":"grabbed"}' if path.endswith("/grab") else b"{}"
                writer.write(b"HTTP/1.1 %s\r\nContent-Length: %d\r\n\r\n%s"
                             % (status, len(answer), answer))  # fmt: skip
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    build, mix = mixed_workload("key", "t", ["act", "2", "3", "p1", "p2"])
    try:
        result = await run(f"http://127.0.0.1:{port}", 300.0, 0.5, 8, build, mix)
    finally:
        server.close()
        await server.wait_closed()
    kinds = result["by_kind"]
    locked = kinds["lock"]["statuses"].get("201", 0)
    assert kinds["grab"]["count"] == 100 and kinds["lock"]["count"] == 50
    assert 0 < locked < 50 and kinds["confirm"]["count"] == locked
    assert result["answered"] == result["requests"] == 150 + locked
    answered_at = {}
    for at, path, body in seen:
        if path.endswith("/locks"):
            answered_at[(path.rsplit("/", 1)[0], body)] = at
    for at, path, body in seen:
        if path.endswith("/members"):
            user = body.split(b'"user_id":"')[1].split(b'"')[0]
            lock = (path.rsplit("/", 1)[0], b'{"user_id":"%s"}' % user)
            assert at - answered_at[lock] >= 0.029  # the payment's 30 ms, after the answer
            assert body == b'{"user_id":"%s","order_id":"%s"}' % (user, user)
    grabs = [(at, path, body) for at, path, body in seen if "/grab" in path]
    assert {path.split("/")[3] for _, path, _ in grabs} == {"p1", "p2"}
    # each grab answered `grabbed` gives its credit's business key and its answer's time
    received = {
        grab_credit_key(path.split("/")[3], body.split(b'"')[3].decode()): at
        for at, path, body in grabs
    }
    due = result["credits_due"]
    assert result["grabbed"] == 100 and set(due) == set(received)
    assert all(received[key] < due[key] < time.perf_counter() for key in due)


def test_confirm_targets_grade_confirms_against_their_grabs_and_credits_within_250_ms() -> None:
    """Per database: the confirm p99 against 3x the grab p99 of its run (issue 24's 30 ms
    shown, not graded); the credit p99 against 250 ms, a credit never seen failing it."""

    def mix(kind: str, impl: str, p99: float, **extra: object) -> dict[str, object]:
        return _row(f"confirm mix @ half capacity: {kind}", "http", impl, 600, p99_ms=p99, **extra)

    sqlite, postgres = "groupbuy (1 worker, SQLite)", "groupbuy (1 worker, PostgreSQL)"
    rows = [
        mix("grab", sqlite, 10.0),
        mix("confirm", sqlite, 31.0),  # over 3x the grab
        mix("credit", sqlite, 240.0, max_ms=300.0, correct={"missing": 0}),
        mix("grab", postgres, 20.0),
        mix("confirm", postgres, 45.0),  # within 3x, over issue 24's 30 ms
        mix("credit", postgres, 120.0, max_ms=130.0, correct={"missing": 2}),
        mix("confirm", "groupbuy (1 worker, MySQL)", 5.0),  # no grab row: not graded
    ]
    found = {what: (figure, target, met) for what, figure, target, met in confirm_targets(rows)}
    confirm = "confirm mix @ half capacity: confirm p99, groupbuy (1 worker, {}) (grab p99 {} ms)"
    credit = "confirm mix @ half capacity: credit p99 (grab answered to credit in SQL), {}"
    assert found == {
        confirm.format("SQLite", "10.0"): (
            "31.0 ms, 3.1x grab (issue 24's <= 30 ms: no)",
            "<= 3x grab",
            "no",
        ),
        confirm.format("PostgreSQL", "20.0"): (
            "45.0 ms, 2.2x grab (issue 24's <= 30 ms: no)",
            "<= 3x grab",
            "yes",
        ),
        credit.format(sqlite): ("240.0 ms (max 300.0 ms)", "<= 250 ms", "yes"),
        credit.format(postgres): (
            "120.0 ms (max 130.0 ms), 2 credits never seen",
            "<= 250 ms",
            "no",
        ),
    }


def test_a_join_flash_is_graded_from_its_answers_and_their_times() -> None:
    def tap(user: str, outcome: str, team: str | None, began: float, ended: float) -> Tap:
        return Tap(user, outcome, team, began, ended)

    fine = [
        tap("a", "locked", "t1", 0.0, 1.0),
        tap("b", "locked", "t1", 0.5, 2.0),
        tap("c", "no_team_available", None, 1.5, 3.0),  # ended after the last grant began
        tap("a", "existing", "t1", 2.5, 3.5),
    ]
    graded = grade_joins(fine, free_seats=2, seats_per_team=2)
    assert graded["winners"] == 2 and graded["wrong_no_team_available"] == 0
    assert graded["over_capacity"] == graded["duplicates"] == graded["spurious_failures"] == 0
    # A refusal that ended before a grant began: the seat was free at the refusal too.
    early = [tap("c", "no_team_available", None, 0.0, 0.2), *fine[:2]]
    assert grade_joins(early, 2, 2)["wrong_no_team_available"] == 1
    # Seats left over: every refusal was wrong.
    short = [fine[0], tap("c", "no_team_available", None, 1.5, 3.0)]
    assert grade_joins(short, 2, 2)["wrong_no_team_available"] == 1
    crowded = [*fine[:2], tap("d", "locked", "t1", 0.1, 0.3), tap("a", "locked", "t2", 4, 5)]
    graded = grade_joins(crowded, 4, 2)
    assert (graded["over_capacity"], graded["duplicates"]) == (1, 1)
    assert grade_joins([tap("e", "conflict", None, 0, 1)], 2, 2)["spurious_failures"] == 1
