"""Small line charts drawn server-side as inline SVG (no script, no CDN, no inline style)."""

from __future__ import annotations

from collections.abc import Sequence

from markupsafe import Markup, escape

WIDTH, HEIGHT, PAD = 600, 140, 4


def _number(value: float) -> str:
    return f"{value:.6g}"


def line_chart(points: Sequence[tuple[float, float]], label: str, unit: str = "") -> Markup:
    """A line through (x, y) points scaled to the chart, with the peak written in the
    corner; an empty chart says there is nothing yet."""
    title = escape(label)
    head = (
        f'<svg class="chart" viewBox="0 0 {WIDTH} {HEIGHT}" role="img" '
        f'aria-label="{title}" xmlns="http://www.w3.org/2000/svg">'
        f'<rect class="chart-frame" x="0" y="0" width="{WIDTH}" height="{HEIGHT}"/>'
    )
    if len(points) < 2:
        text = f'<text class="chart-note" x="{PAD * 2}" y="{HEIGHT // 2}">no samples yet</text>'
        return Markup(head + text + "</svg>")
    xs = [x for x, _ in points]
    ys = [y for _, y in points]
    x0, x1 = min(xs), max(xs)
    top = max(ys) or 1.0
    span_x = (x1 - x0) or 1.0
    coords = " ".join(
        f"{_number(PAD + (x - x0) / span_x * (WIDTH - 2 * PAD))},"
        f"{_number(HEIGHT - PAD - y / top * (HEIGHT - 2 * PAD))}"
        for x, y in points
    )
    peak = f"max {_number(round(max(ys), 2))}{unit}"
    return Markup(
        head + f'<polyline class="chart-line" fill="none" points="{coords}"/>'
        f'<text class="chart-note" x="{PAD * 2}" y="16">{title}: {peak}</text></svg>'
    )
