"""Small inline SVG charts for the report: step lines with dots, and horizontal bars.

Plain strings, no dependencies: the report must open anywhere without a network, and
matplotlib is not a dependency. Every value shown also has a ``<title>`` (the browser's
tooltip).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from html import escape

PALETTE = ("#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f")


@dataclass(frozen=True)
class Series:
    """One line of a chart: points in data units, drawn as a step line and/or dots."""

    label: str
    xs: Sequence[float]
    ys: Sequence[float]
    color: str = PALETTE[0]
    step: bool = True
    dots: bool = False
    line: bool = True
    dashed: bool = False


@dataclass(frozen=True)
class Axes:
    """Chart size and axis titles."""

    x_label: str
    y_label: str
    width: int = 380
    height: int = 220
    margin: tuple[int, int, int, int] = (12, 12, 38, 56)  # top, right, bottom, left
    title: str = ""
    log_y: bool = False
    legend: bool = True
    extra: list[str] = field(default_factory=list)


def nice_ticks(lo: float, hi: float, count: int = 5) -> list[float]:
    """About ``count`` round tick values covering ``[lo, hi]``."""
    if not math.isfinite(lo) or not math.isfinite(hi):
        return []
    if hi <= lo:
        hi = lo + (abs(lo) or 1.0)
    raw = (hi - lo) / max(count, 1)
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw)
    first = math.floor(lo / step) * step
    ticks = [round(first, 12)]
    # The last tick is at or past ``hi``, so every point lies inside the axes.
    while ticks[-1] < hi - step * 1e-9:
        ticks.append(round(first + len(ticks) * step, 12))
    return ticks


def log_ticks(lo: float, hi: float) -> list[float]:
    """Ticks of a log axis covering ``[lo, hi]`` (both > 0): decades, with 2 and 5 within few decades."""
    a, b = math.floor(math.log10(lo)), math.ceil(math.log10(hi))
    if b == a:
        b += 1
    mults = (1, 2, 5) if b - a <= 3 else (1,)
    ticks = [m * 10.0**e for e in range(a, b + 1) for m in mults]
    below = [t for t in ticks if t <= lo]
    above = [t for t in ticks if t >= hi]
    return [t for t in ticks if (below[-1] if below else ticks[0]) <= t <= (above[0] if above else ticks[-1])]


def _fmt(v: float) -> str:
    if v == 0:
        return "0"
    if abs(v) >= 1000:
        return f"{v:,.0f}"
    if abs(v) >= 10:
        return f"{v:.0f}"
    if abs(v) >= 1:
        return f"{v:.1f}".rstrip("0").rstrip(".")
    return f"{v:.3g}"


def line_chart(series: Sequence[Series], axes: Axes) -> str:
    """An SVG chart of ``series`` with ticks, axis titles and a legend; y from 0, or log with ``log_y``."""
    top, right, bottom, left = axes.margin
    w, h = axes.width, axes.height
    pw, ph = w - left - right, h - top - bottom
    xs = [x for s in series for x in s.xs]
    ys = [y for s in series for y in s.ys]
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" class="chart" width="{w}" height="{h}" '
             f'viewBox="0 0 {w} {h}" role="img" aria-label="{escape(axes.title or axes.y_label)}">']
    if axes.title:
        parts.append(f"<title>{escape(axes.title)}</title>")
    parts.append(f'<rect x="{left}" y="{top}" width="{pw}" height="{ph}" fill="#fff" stroke="#ccc"/>')
    if not xs:
        parts.append(f'<text x="{left + pw / 2}" y="{top + ph / 2}" text-anchor="middle" fill="#888">no data</text>')
        parts.append("</svg>")
        return "".join(parts)
    xticks = nice_ticks(min(0.0, min(xs)), max(xs))
    log = axes.log_y and min(ys) > 0
    yticks = log_ticks(min(ys), max(ys)) if log else nice_ticks(0.0, max(ys) * 1.05 if max(ys) > 0 else 1.0)
    x0, x1 = xticks[0], xticks[-1]
    ty = math.log10 if log else float
    y0, y1 = ty(yticks[0]), ty(yticks[-1])

    def px(x: float) -> float:
        return left + (x - x0) / ((x1 - x0) or 1.0) * pw

    def py(y: float) -> float:
        return top + ph - (ty(y) - y0) / ((y1 - y0) or 1.0) * ph

    for t in xticks:
        parts.append(f'<line x1="{px(t):.1f}" y1="{top}" x2="{px(t):.1f}" y2="{top + ph}" stroke="#eee"/>'
                     f'<text x="{px(t):.1f}" y="{top + ph + 14}" text-anchor="middle" font-size="10">{_fmt(t)}</text>')
    for t in yticks:
        parts.append(f'<line x1="{left}" y1="{py(t):.1f}" x2="{left + pw}" y2="{py(t):.1f}" stroke="#eee"/>'
                     f'<text x="{left - 4}" y="{py(t) + 3:.1f}" text-anchor="end" font-size="10">{_fmt(t)}</text>')
    parts.append(f'<text x="{left + pw / 2}" y="{h - 6}" text-anchor="middle" font-size="11">'
                 f"{escape(axes.x_label)}</text>")
    parts.append(f'<text transform="translate(12 {top + ph / 2}) rotate(-90)" text-anchor="middle" '
                 f'font-size="11">{escape(axes.y_label)}</text>')
    for s in series:
        if not s.xs:
            continue
        pts = list(zip(s.xs, s.ys, strict=True))
        if s.dots:
            parts.append(f'<g fill="{s.color}" fill-opacity="0.35">')
            parts.extend(f'<circle cx="{px(x):.1f}" cy="{py(y):.1f}" r="2.5"><title>{escape(s.label)}: '
                         f"{_fmt(x)}, {y:.4g}</title></circle>" for x, y in pts)
            parts.append("</g>")
        if s.line:
            d = [f"M{px(pts[0][0]):.1f},{py(pts[0][1]):.1f}"]
            for x, y in pts[1:]:
                d.append(f"H{px(x):.1f}V{py(y):.1f}" if s.step else f"L{px(x):.1f},{py(y):.1f}")
            if s.step and len(pts) > 0:
                d.append(f"H{px(max(xs)):.1f}")
            dash = ' stroke-dasharray="5 3"' if s.dashed else ""
            parts.append(f'<path class="curve" d="{"".join(d)}" fill="none" stroke="{s.color}" stroke-width="1.8"'
                         f"{dash}><title>{escape(s.label)}</title></path>")
    legend = [s for s in series if s.xs and s.line] if axes.legend else []
    for n, s in enumerate(legend):
        y = top + 12 + 13 * n
        dash = ' stroke-dasharray="5 3"' if s.dashed else ""
        parts.append(f'<line x1="{left + pw - 118}" y1="{y - 4}" x2="{left + pw - 100}" y2="{y - 4}" '
                     f'stroke="{s.color}" stroke-width="2"{dash}/>'
                     f'<text x="{left + pw - 96}" y="{y}" font-size="10">{escape(s.label[:20])}</text>')
    parts.extend(axes.extra)
    parts.append("</svg>")
    return "".join(parts)


def bar_chart(rows: Sequence[tuple[str, float, str]], *, unit: str, width: int = 560, bar: int = 18) -> str:
    """Horizontal bars ``(label, value, color)`` scaled to the largest value, with values printed."""
    label_w, gap = 210, 6
    h = len(rows) * (bar + gap) + gap
    top = max((v for _, v, _ in rows), default=0.0) or 1.0
    plot = width - label_w - 90
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" class="bars" width="{width}" height="{h}" '
             f'viewBox="0 0 {width} {h}" role="img">']
    for n, (label, value, color) in enumerate(rows):
        y = gap + n * (bar + gap)
        wbar = max(value / top * plot, 1.0 if value > 0 else 0.0)
        parts.append(f'<text x="{label_w - 6}" y="{y + bar - 5}" text-anchor="end" font-size="11">'
                     f"{escape(label)}</text>"
                     f'<rect x="{label_w}" y="{y}" width="{wbar:.1f}" height="{bar}" fill="{color}">'
                     f"<title>{escape(label)}: {value:.4g} {escape(unit)}</title></rect>"
                     f'<text x="{label_w + wbar + 4:.1f}" y="{y + bar - 5}" font-size="11">{_fmt(value)} '
                     f"{escape(unit)}</text>")
    parts.append("</svg>")
    return "".join(parts)
