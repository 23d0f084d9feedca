"""The console part of docs/benchmarks.md: its own section, written alone or by the full run.

benchmarks/console_cost.py keeps its results under the "console" key of
docs/benchmarks.json and replaces only the section between the two markers in
docs/benchmarks.md, so the rest of the report (another run's figures) stays as it was;
benchmarks/run.py writes the same section from the same key.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

BEGIN = "<!-- console-cost: begin (benchmarks/console_cost.py) -->"
END = "<!-- console-cost: end -->"
BOUND_MS = 200.0


def _ms(value: float | None) -> str:
    return "–" if value is None else f"{value:,.1f}"


def section(console: dict[str, Any]) -> str:
    """The Markdown of one console run: pages and listings, the grab with consoles open,
    and the Redis commands the page loads sent."""
    meta = console["meta"]
    lines = [
        BEGIN,
        "## Console and listings",
        "",
        f"`{meta['command']}` on {meta['machine']}, {meta['date']}: {meta['seeded']}. "
        "One `groupbuy serve` worker, signed in with an admin key; each page is asked "
        f"{meta['requests']} times in a row"
        + (f" ({meta['counts_in_redis']})" if meta.get("counts_in_redis") else "")
        + f". Target: p99 within {BOUND_MS:.0f} ms "
        "(SPEC §3 Console). The load average (1 min) is the machine's when the figure "
        "was taken: the machine is shared.",
        "",
        "| page | requests | p50 ms | p99 ms | within 200 ms | load |",
        "| --- | ---: | ---: | ---: | --- | ---: |",
    ]
    for row in console["pages"]:
        met = row["p99_ms"] is not None and row["p99_ms"] <= BOUND_MS
        lines.append(
            f"| `{row['path']}` | {row['ops']} | {_ms(row['p50_ms'])} | {_ms(row['p99_ms'])} "
            f"| {'yes' if met else 'no'} | {row['load_1m']:.2f} |"
        )
    grab = console.get("grab")
    if grab:
        c = grab["comparison"]
        loads = ", ".join(f"{x:.2f}" for x in grab["loads_1m"])
        lines += [
            "",
            f"HTTP flash grab (wrk, as the HTTP level) with {grab['consoles']} consoles open "
            f"/ with none, {c['rounds']} alternated rounds: median ratio "
            f"**{c['median']:.0%}** (lowest {c['min']:.0%}, highest {c['max']:.0%}); target "
            f">= {c['target_min']:.0%}: {'met' if c['met'] else 'not met'}. "
            f"{grab['how']} Rates (grabs/s): none {grab['rates']['none']}, "
            f"with consoles {grab['rates']['consoles']}; load at each round: {loads}.",
        ]
    redis = console["redis_commands"]
    lines += [
        "",
        f"Redis commands while the pages were asked: {redis['total']} in all; scans "
        f"(`KEYS`, `SCAN`, `HSCAN`, `SSCAN`, `ZSCAN`): {redis['scans']}.",
        END,
    ]
    return "\n".join(lines)


def splice(markdown: str, console: dict[str, Any]) -> str:
    """`markdown` with the console section replaced (or added at the end)."""
    text = section(console)
    pattern = re.compile(re.escape(BEGIN) + ".*?" + re.escape(END), re.S)
    if pattern.search(markdown):
        return pattern.sub(lambda _: text, markdown)
    return markdown.rstrip("\n") + "\n\n" + text + "\n"


def write(docs: Path, console: dict[str, Any]) -> None:
    """Keep `console` in docs/benchmarks.json and its section in docs/benchmarks.md."""
    saved_path = docs / "benchmarks.json"
    saved = json.loads(saved_path.read_text("utf-8")) if saved_path.exists() else {"rows": []}
    saved["console"] = console
    saved_path.write_text(json.dumps(saved, indent=1) + "\n", encoding="utf-8")
    report = docs / "benchmarks.md"
    current = report.read_text("utf-8") if report.exists() else "# Benchmarks\n"
    report.write_text(splice(current, console), encoding="utf-8")
