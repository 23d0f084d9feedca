"""The benchmark's report: ratios against each baseline and the Markdown built from rows."""

from __future__ import annotations

from benchmarks.run import markdown, ratios


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


ROWS = [
    _row("flash_grab", "engine", "groupbuy", 5000),
    _row("flash_grab", "engine", "naive", 1000),
    _row("evalsha_grab", "redis-benchmark", "redis-benchmark evalsha", 20000, pipeline=1),
    _row("evalsha_grab", "redis-benchmark", "redis-benchmark evalsha", 40000, pipeline=16),
    _row("flash_grab", "http", "groupbuy (1 worker)", 2000),
    _row("flash_grab", "http", "bare starlette + 1 redis call (1 worker)", 4000),
]


def test_ratios_compare_each_row_with_its_baseline() -> None:
    found = {what: ratio for what, ratio, _target in ratios(ROWS)}
    assert found["engine grab / redis-benchmark EVALSHA of the same script, -P 1"] == "25%"
    assert found["engine grab / redis-benchmark EVALSHA of the same script, -P 16"] == "12%"
    assert found["engine grab / naive multi-round-trip + SETNX mutex"] == "500%"
    assert found["HTTP grab, 1 worker(s) / bare Starlette + one Redis call"] == "50%"
    assert found["HTTP grab, 2 worker(s) / bare Starlette + one Redis call"] == "n/a"
    assert found["engine lock / naive multi-round-trip + SETNX mutex"] == "n/a"
    assert found["engine grab p99 at half the maximum rate (open loop)"] == "n/a"


def test_markdown_lists_rows_ratios_and_correctness() -> None:
    text = markdown(ROWS, {"quick": True, "date": "today", "machine": "here"})
    assert "| flash_grab | engine | groupbuy | 100 | 5,000 |" in text
    assert "| engine grab / naive multi-round-trip + SETNX mutex | 500% | > 100% |" in text
    assert "duplicates 0" in text and "benchmarks-latency.png" in text
