"""The benchmark: engine level, HTTP level and the baselines, side by side in one run.

Starts a private redis-server on a free loopback port (and, for the HTTP level, the
service and a bare Starlette app), runs every scenario, stops everything, and writes
docs/benchmarks.json, docs/benchmarks.md (tables with the ratios to each baseline) and
docs/benchmarks-latency.png. Usage:

    .venv/bin/python -m benchmarks.run            # the full run (a few minutes)
    .venv/bin/python -m benchmarks.run --quick    # a smoke run (about a minute)
"""

from __future__ import annotations

import argparse
import asyncio
import json
import platform
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.engine import run_engine
from benchmarks.http_level import run_http
from groupbuy.testing.servers import start_redis

DOCS = Path(__file__).resolve().parent.parent / "docs"


def _find(
    rows: list[dict[str, Any]], scenario: str, level: str, impl: str
) -> dict[str, Any] | None:
    """The first row whose scenario and level match and whose implementation starts with impl."""
    for row in rows:
        if (
            row["scenario"] == scenario
            and row["level"] == level
            and str(row["implementation"]).startswith(impl)
        ):
            return row
    return None


def _ratio(row: dict[str, Any] | None, base: dict[str, Any] | None) -> str:
    if not row or not base or not base.get("ops_per_s"):
        return "n/a"
    return f"{row['ops_per_s'] / base['ops_per_s']:.0%}"


def ratios(rows: list[dict[str, Any]]) -> list[tuple[str, str, str]]:
    """(what, ratio, target) for every comparison the issue asks for."""
    out = []
    for scenario, script in (("flash_grab", "grab"), ("lock_storm", "lock")):
        mine = _find(rows, scenario, "engine", "groupbuy")
        naive = _find(rows, scenario, "engine", "naive")
        for pipeline in (1, 16):
            bench = next(
                (
                    r
                    for r in rows
                    if r["scenario"] == f"evalsha_{script}" and r.get("pipeline") == pipeline
                ),
                None,
            )
            what = f"engine {script} / redis-benchmark EVALSHA of the same script, -P {pipeline}"
            out.append((what, _ratio(mine, bench), ">= 50%"))
        out.append(
            (
                f"engine {script} / naive multi-round-trip + SETNX mutex",
                _ratio(mine, naive),
                "> 100%",
            )
        )
        for workers in (1, 2):
            http = _find(rows, scenario, "http", f"groupbuy ({workers} worker")
            bare = _find(rows, scenario, "http", f"bare starlette + 1 redis call ({workers} worker")
            out.append(
                (
                    f"HTTP {script}, {workers} worker(s) / bare Starlette + one Redis call",
                    _ratio(http, bare),
                    ">= 70%",
                )
            )
    for workers in (1, 2):
        http = _find(rows, "mixed", "http", f"groupbuy ({workers} worker")
        bare = _find(rows, "mixed", "http", f"bare starlette + 1 redis call ({workers} worker")
        what = f"HTTP mixed, {workers} worker(s) / bare Starlette + one Redis call"
        out.append((what, _ratio(http, bare), ">= 70%"))
    for kind in ("grab", "lock"):
        row = next((r for r in rows if r["scenario"] == f"{kind} @ half max rate"), None)
        p99 = f"{row['p99_ms']:.1f} ms" if row and row.get("p99_ms") is not None else "n/a"
        out.append((f"engine {kind} p99 at half the maximum rate (open loop)", p99, "<= 20 ms"))
    return out


def _fmt(value: Any, digits: int = 2) -> str:
    if value is None:
        return "–"
    if isinstance(value, float):
        return f"{value:,.{digits}f}"
    return f"{value:,}" if isinstance(value, int) else str(value)


def markdown(rows: list[dict[str, Any]], meta: dict[str, Any]) -> str:
    """docs/benchmarks.md: the figures, the ratios, the correctness counts."""
    lines = [
        "# Benchmarks",
        "",
        f"One run of `.venv/bin/python -m benchmarks.run{' --quick' if meta['quick'] else ''}` "
        f"on {meta['machine']}, {meta['date']}; every figure below comes from the same run, "
        "against the same private redis-server (no persistence). Figures on this machine vary "
        "by ±40% between runs. What was tried, what helped and where the time goes: "
        "[benchmarks-findings.md](benchmarks-findings.md).",
        "",
        "## Throughput and latency",
        "",
        "| scenario | level | implementation | ops | ops/s | p50 ms | p95 ms | p99 ms | note |",
        "| --- | --- | --- | ---: | ---: | ---: | ---: | ---: | --- |",
    ]
    for r in rows:
        lines.append(
            f"| {r['scenario']} | {r['level']} | {r['implementation']} | {_fmt(r.get('ops'))} | "
            f"{_fmt(r.get('ops_per_s'), 0)} | {_fmt(r.get('p50_ms'))} | {_fmt(r.get('p95_ms'))} | "
            f"{_fmt(r.get('p99_ms'))} | {r.get('note', '')} |"
        )
    lines += ["", "## Ratios", "", "| comparison | ratio | target |", "| --- | ---: | --- |"]
    lines += [f"| {what} | {ratio} | {target} |" for what, ratio, target in ratios(rows)]
    lines += [
        "",
        "## Correctness counts",
        "",
        "| scenario | level | implementation | counts |",
        "| --- | --- | --- | --- |",
    ]
    for r in rows:
        if r.get("correct"):
            counts = ", ".join(f"{k} {v}" for k, v in r["correct"].items())
            lines.append(f"| {r['scenario']} | {r['level']} | {r['implementation']} | {counts} |")
    lines += ["", "![latency distributions](benchmarks-latency.png)", ""]
    return "\n".join(lines)


def plot(rows: list[dict[str, Any]], path: Path) -> bool:
    """A PNG of the latency distributions (CDF) of every row that kept a sample."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed (pip install -e '.[bench]'): no plot")
        return False
    fig, ax = plt.subplots(figsize=(9, 5))
    for r in rows:
        sample = sorted(r.get("latencies_ms") or [])
        if len(sample) < 10:
            continue
        ys = [i / (len(sample) - 1) for i in range(len(sample))]
        ax.plot(sample, ys, label=f"{r['scenario']} · {r['level']} · {r['implementation']}")
    ax.set_xscale("log")
    ax.set_xlabel("latency (ms, log scale)")
    ax.set_ylabel("fraction of requests")
    ax.set_title("groupbuy latency, one benchmark run")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small loads, for a smoke run")
    parser.add_argument("--out", type=Path, default=DOCS, help="where to write the results")
    parser.add_argument(
        "--rewrite",
        action="store_true",
        help="only rebuild the Markdown and the plot from benchmarks.json",
    )
    args = parser.parse_args()
    if args.rewrite:
        saved = json.loads((args.out / "benchmarks.json").read_text(encoding="utf-8"))
        plot(saved["rows"], args.out / "benchmarks-latency.png")
        (args.out / "benchmarks.md").write_text(markdown(saved["rows"], saved["meta"]), "utf-8")
        return
    args.out.mkdir(parents=True, exist_ok=True)
    redis_version = subprocess.run(["redis-server", "--version"], capture_output=True, text=True)
    meta = {
        "quick": args.quick,
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "machine": f"{platform.system()} {platform.machine()}, Python {platform.python_version()}, "
        f"{redis_version.stdout.split()[2] if redis_version.stdout else 'redis ?'}",
    }
    server = start_redis()
    rows: list[dict[str, Any]] = []
    try:
        with tempfile.TemporaryDirectory(prefix="groupbuy-bench-") as workdir:
            database = f"sqlite+aiosqlite:///{workdir}/engine.db"
            print(f"== engine level (redis {server.url})")
            rows += asyncio.run(run_engine(server.url, database, args.quick))
            print("== HTTP level")
            rows += run_http(server.url, Path(workdir), args.quick)
    finally:
        server.stop()
    (args.out / "benchmarks.json").write_text(
        json.dumps({"meta": meta, "rows": rows}, indent=1) + "\n", encoding="utf-8"
    )
    plot(rows, args.out / "benchmarks-latency.png")
    (args.out / "benchmarks.md").write_text(markdown(rows, meta), encoding="utf-8")
    for what, ratio, target in ratios(rows):
        print(f"{what:<70} {ratio:>6}  (target {target})")
    print(f"written: {args.out / 'benchmarks.md'}")


if __name__ == "__main__":
    main()
