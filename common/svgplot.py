"""Small, dependency-free SVG charts for the privacy report (a line, a step line, a histogram, bars).

The report must work after the main install — hospitals install as little as
possible — so it draws its three simple charts itself as inline SVG: text
stays selectable, prints sharply and needs no image decoder.  Each function
returns one ``<svg>`` element with ``role="img"``, an ``aria-label`` and a
``<title>`` (the alternative text).
"""
from __future__ import annotations

import html
import math
from dataclasses import dataclass

import numpy as np

WIDTH, HEIGHT = 640, 260
LEFT, RIGHT, TOP, BOTTOM = 58, 16, 14, 44
BLUE, RED, GRID, INK = "#1f5f8b", "#b03a2e", "#d9dde3", "#1b1b1b"


def nice_ticks(lo: float, hi: float, n: int = 5, integer: bool = False) -> list[float]:
    """About ``n`` round tick values (1, 2, 2.5 or 5 × 10^k steps) covering ``[lo, hi]``."""
    if not hi > lo:
        hi = lo + 1.0
    raw = (hi - lo) / max(n, 1)
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw)
    if integer:
        step = max(1.0, math.ceil(step))
    start = math.ceil(lo / step - 1e-9) * step
    ticks = []
    k = 0
    while start + k * step <= hi + 1e-9 * step:
        ticks.append(round(start + k * step, 12))
        k += 1
    return ticks


def _fmt(v: float) -> str:
    return f"{v:.6g}"


@dataclass(frozen=True)
class _Axes:
    x0: float
    x1: float
    y0: float
    y1: float

    def x(self, v) -> np.ndarray:
        return LEFT + (np.asarray(v, float) - self.x0) / (self.x1 - self.x0 or 1.0) * (WIDTH - LEFT - RIGHT)

    def y(self, v) -> np.ndarray:
        return HEIGHT - BOTTOM - (np.asarray(v, float) - self.y0) / (self.y1 - self.y0 or 1.0) * (
            HEIGHT - TOP - BOTTOM)


def _frame(ax: _Axes, xlabel: str, ylabel: str, x_integer: bool, y_integer: bool) -> list[str]:
    out = []
    for t in nice_ticks(ax.y0, ax.y1, 5, y_integer):
        y = float(ax.y(t))
        out.append(f'<line x1="{LEFT}" x2="{WIDTH - RIGHT}" y1="{y:.1f}" y2="{y:.1f}" stroke="{GRID}"/>')
        out.append(f'<text x="{LEFT - 6}" y="{y + 4:.1f}" text-anchor="end">{_fmt(t)}</text>')
    for t in nice_ticks(ax.x0, ax.x1, 6, x_integer):
        x = float(ax.x(t))
        out.append(f'<line x1="{x:.1f}" x2="{x:.1f}" y1="{TOP}" y2="{HEIGHT - BOTTOM}" stroke="{GRID}"/>')
        out.append(f'<text x="{x:.1f}" y="{HEIGHT - BOTTOM + 16}" text-anchor="middle">{_fmt(t)}</text>')
    out.append(f'<rect x="{LEFT}" y="{TOP}" width="{WIDTH - LEFT - RIGHT}" height="{HEIGHT - TOP - BOTTOM}" '
               f'fill="none" stroke="{INK}" stroke-width="0.8"/>')
    out.append(f'<text x="{(LEFT + WIDTH - RIGHT) / 2:.1f}" y="{HEIGHT - 8}" text-anchor="middle">'
               f'{html.escape(xlabel)}</text>')
    out.append(f'<text x="14" y="{(TOP + HEIGHT - BOTTOM) / 2:.1f}" text-anchor="middle" '
               f'transform="rotate(-90 14 {(TOP + HEIGHT - BOTTOM) / 2:.1f})">{html.escape(ylabel)}</text>')
    return out


def _svg(title: str, body: list[str], legend: list[tuple[str, str, bool]] = ()) -> str:
    items = []
    if legend:  # lower right, on a white box (where the report's rising curves leave room)
        y0 = HEIGHT - BOTTOM - 8 - 16 * len(legend)
        items.append(f'<rect x="{WIDTH - RIGHT - 198}" y="{y0}" width="192" height="{16 * len(legend) + 4}" '
                     f'fill="#ffffff" fill-opacity="0.85" stroke="{GRID}"/>')
    for k, (label, color, dashed) in enumerate(legend):
        y = HEIGHT - BOTTOM - 8 - 16 * (len(legend) - 1 - k) - 4
        x = WIDTH - RIGHT - 190
        dash = ' stroke-dasharray="5 3"' if dashed else ""
        items.append(f'<line x1="{x}" x2="{x + 22}" y1="{y - 4}" y2="{y - 4}" stroke="{color}" stroke-width="2"{dash}/>'
                     f'<text x="{x + 28}" y="{y}">{html.escape(label)}</text>')
    t = html.escape(title, quote=True)
    return (f'<svg xmlns="http://www.w3.org/2000/svg" role="img" aria-label="{t}" viewBox="0 0 {WIDTH} {HEIGHT}" '
            f'width="{WIDTH}" height="{HEIGHT}" font-family="DejaVu Sans, sans-serif" font-size="11" fill="{INK}">'
            f'<title>{t}</title>' + "".join(body) + "".join(items) + "</svg>")


def _polyline(xs: np.ndarray, ys: np.ndarray, color: str, width: float = 2.0) -> str:
    pts = " ".join(f"{x:.1f},{y:.1f}" for x, y in zip(xs, ys))
    return f'<polyline points="{pts}" fill="none" stroke="{color}" stroke-width="{width}"/>'


def _hline(ax: _Axes, v: float, color: str) -> str:
    y = float(ax.y(v))
    return (f'<line x1="{LEFT}" x2="{WIDTH - RIGHT}" y1="{y:.1f}" y2="{y:.1f}" stroke="{color}" '
            f'stroke-width="1.2" stroke-dasharray="5 3"/>')


def line_chart(x, y, title: str, xlabel: str, ylabel: str, label: str, ref: float | None = None,
               ref_label: str = "", x_integer: bool = True) -> str:
    """``y`` against ``x`` from ``y = 0``, with an optional dashed horizontal reference line."""
    x, y = np.asarray(x, float), np.asarray(y, float)
    top = max(float(np.max(y)) if y.size else 0.0, ref or 0.0) * 1.08 or 1.0
    ax = _Axes(float(x.min()), float(x.max()), 0.0, top)
    body = _frame(ax, xlabel, ylabel, x_integer, False) + [_polyline(ax.x(x), ax.y(y), BLUE)]
    legend = [(label, BLUE, False)]
    if ref is not None:
        body.append(_hline(ax, ref, RED))
        legend.append((ref_label, RED, True))
    return _svg(title, body, legend)


def step_chart(counts, title: str, xlabel: str, ylabel: str, label: str, ref: float | None = None,
               ref_label: str = "") -> str:
    """Integer counts per step 1..n as a step line (each step centred on its index)."""
    c = np.asarray(counts, float)
    n = c.size
    ax = _Axes(0.5, n + 0.5, 0.0, max(float(c.max()) if n else 1.0, ref or 0.0, 1.0) + 0.5)
    xs = np.repeat(np.arange(n + 1) + 0.5, 2)[1:-1]
    ys = np.repeat(c, 2)
    body = _frame(ax, xlabel, ylabel, True, True) + [_polyline(ax.x(xs), ax.y(ys), BLUE)]
    legend = [(label, BLUE, False)]
    if ref:
        body.append(_hline(ax, ref, RED))
        legend.append((ref_label, RED, True))
    return _svg(title, body, legend)


def histogram(values, bins: int, lo: float, hi: float, title: str, xlabel: str, ylabel: str) -> str:
    """Counts of ``values`` in ``bins`` equal bins over ``[lo, hi]`` as bars."""
    counts, edges = np.histogram(np.clip(np.asarray(values, float), lo, hi), bins=bins, range=(lo, hi))
    ax = _Axes(lo, hi, 0.0, max(float(counts.max()), 1.0) * 1.08)
    body = _frame(ax, xlabel, ylabel, False, True)
    y0 = float(ax.y(0))
    for k, cnt in enumerate(counts):
        if cnt:
            xa, xb, yt = float(ax.x(edges[k])), float(ax.x(edges[k + 1])), float(ax.y(cnt))
            body.append(f'<rect x="{xa:.1f}" y="{yt:.1f}" width="{max(xb - xa - 0.6, 0.5):.1f}" '
                        f'height="{y0 - yt:.1f}" fill="{BLUE}"><title>{int(cnt)}</title></rect>')
    return _svg(title, body)


def bar_chart(labels, values, title: str, xlabel: str) -> str:
    """Horizontal bars, one per label, top to bottom in the order given (values ≥ 0)."""
    v = np.asarray(values, float)
    row, left = 18, 150
    height = TOP + BOTTOM + row * len(v)
    top = float(v.max()) * 1.08 if v.size and v.max() > 0 else 1.0
    scale = (WIDTH - left - RIGHT) / top
    body = []
    for t in nice_ticks(0.0, top, 5):
        x = left + t * scale
        body.append(f'<line x1="{x:.1f}" x2="{x:.1f}" y1="{TOP}" y2="{height - BOTTOM}" stroke="{GRID}"/>'
                    f'<text x="{x:.1f}" y="{height - BOTTOM + 16}" text-anchor="middle">{_fmt(t)}</text>')
    for k, (label, value) in enumerate(zip(labels, v)):
        y = TOP + k * row
        body.append(f'<text x="{left - 6}" y="{y + row - 5}" text-anchor="end">{html.escape(str(label))}</text>'
                    f'<rect x="{left}" y="{y + 3}" width="{max(value * scale, 0.5):.1f}" height="{row - 6}" '
                    f'fill="{BLUE}"><title>{html.escape(str(label))}: {_fmt(value)}</title></rect>')
    body.append(f'<text x="{(left + WIDTH - RIGHT) / 2:.1f}" y="{height - 8}" text-anchor="middle">'
                f'{html.escape(xlabel)}</text>')
    svg = _svg(title, body)
    return svg.replace(f'viewBox="0 0 {WIDTH} {HEIGHT}"', f'viewBox="0 0 {WIDTH} {height}"', 1).replace(
        f'height="{HEIGHT}"', f'height="{height}"', 1)
