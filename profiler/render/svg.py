"""Tiny inline-SVG charts for the HTML report: line charts and stacked bars, axis ticks, legends.

Maps numbers the analysis computed to pixels; computes no figure. The output is a standalone ``<svg>``
element that is well-formed XML (every text escaped, no entities beyond XML's own), references nothing
outside itself (no fonts, images or scripts) and writes only finite coordinates: NaN values are gaps in a
line, never a point at 0.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from html import escape

# Okabe-Ito: distinguishable with the common colour-vision deficiencies, and in greyscale print.
PALETTE = ("#0072B2", "#D55E00", "#009E73", "#CC79A7", "#E69F00", "#56B4E9", "#F0E442", "#000000")

_FONT_PX = 12
_CHAR_PX = 6.6  # rough mean advance of a 12 px sans-serif glyph, for laying out legends
_M_LEFT, _M_RIGHT, _M_TOP, _M_BOTTOM = 64, 16, 34, 44


@dataclass(frozen=True, slots=True)
class Line:
    label: str
    xs: Sequence[float]
    ys: Sequence[float]
    color: str
    dashed: bool = False


@dataclass(frozen=True, slots=True)
class Stack:
    """One layer of a stacked bar chart: ``values[i]`` is its height in bar ``i``."""

    label: str
    values: Sequence[float]
    color: str


@dataclass(frozen=True, slots=True)
class Band:
    """A shaded x-range with a label (warm-up steps, for instance)."""

    x0: float
    x1: float
    label: str


def nice_ticks(lo: float, hi: float, target: int = 5) -> list[float]:
    """About ``target`` round tick values (1, 2, 5 x 10**k apart) covering [lo, hi]."""
    if not (math.isfinite(lo) and math.isfinite(hi)):
        return []
    if hi <= lo:
        hi = lo + 1.0
    raw = (hi - lo) / max(1, target)
    exp = math.floor(math.log10(raw))
    step = next(m * 10.0**exp for m in (1.0, 2.0, 5.0, 10.0) if m * 10.0**exp >= raw * (1 - 1e-9))
    first = math.ceil(lo / step - 1e-9)
    last = math.floor(hi / step + 1e-9)
    return [round(k * step, 12) for k in range(first, last + 1)]


def nice_max(hi: float, floor: float = 0.0) -> float:
    """The smallest tick value >= max(hi, floor), so the top of an axis lands on a tick."""
    top = max(hi, floor)
    if not math.isfinite(top) or top <= 0:
        return 1.0
    ticks = nice_ticks(0.0, top)
    if ticks[-1] >= top * (1 - 1e-9):
        return ticks[-1]
    return ticks[-1] + (ticks[1] - ticks[0])


def _fmt_tick(v: float, ticks: Sequence[float]) -> str:
    step = abs(ticks[1] - ticks[0]) if len(ticks) > 1 else 1.0
    decimals = max(0, -math.floor(math.log10(step))) if step > 0 else 0
    return f"{v:.{decimals}f}"


def _n(x: float) -> str:
    """A coordinate: finite by construction; rounding keeps the markup small."""
    if not math.isfinite(x):
        raise ValueError(f"non-finite SVG coordinate {x!r}")
    s = f"{x:.1f}"
    return s[:-2] if s.endswith(".0") else s


def _t(text: str) -> str:
    return escape(text, quote=True)


class _Frame:
    """Plot area geometry and the data -> pixel mapping of one chart."""

    def __init__(self, width: int, height: int, x: tuple[float, float], y: tuple[float, float]) -> None:
        self.width, self.height = width, height
        self.left, self.top = _M_LEFT, _M_TOP
        self.right, self.bottom = width - _M_RIGHT, height - _M_BOTTOM
        self.x0, self.x1 = x if x[1] > x[0] else (x[0], x[0] + 1.0)
        self.y0, self.y1 = y if y[1] > y[0] else (y[0], y[0] + 1.0)

    def px(self, x: float) -> float:
        x = min(max(x, self.x0), self.x1)  # a bucket reaching past the run's end stops at the frame
        return self.left + (x - self.x0) / (self.x1 - self.x0) * (self.right - self.left)

    def py(self, y: float) -> float:
        y = min(max(y, self.y0), self.y1)  # off-scale values sit on the frame rather than outside it
        return self.bottom - (y - self.y0) / (self.y1 - self.y0) * (self.bottom - self.top)


def _axes(f: _Frame, x_label: str, y_label: str, x_ticks: Sequence[float], y_ticks: Sequence[float]) -> list[str]:
    out = ['<g class="axes" font-size="11" fill="#444">']
    for v in y_ticks:
        y = _n(f.py(v))
        out.append(f'<line x1="{_n(f.left)}" y1="{y}" x2="{_n(f.right)}" y2="{y}" stroke="#e3e3e3"/>')
        out.append(
            f'<text x="{_n(f.left - 6)}" y="{y}" text-anchor="end" dominant-baseline="middle">'
            f"{_t(_fmt_tick(v, y_ticks))}</text>"
        )
    for v in x_ticks:
        x = _n(f.px(v))
        out.append(f'<line x1="{x}" y1="{_n(f.bottom)}" x2="{x}" y2="{_n(f.bottom + 4)}" stroke="#666"/>')
        out.append(f'<text x="{x}" y="{_n(f.bottom + 16)}" text-anchor="middle">{_t(_fmt_tick(v, x_ticks))}</text>')
    out.append(
        f'<rect x="{_n(f.left)}" y="{_n(f.top)}" width="{_n(f.right - f.left)}" height="{_n(f.bottom - f.top)}" '
        'fill="none" stroke="#999"/>'
    )
    out.append(
        f'<text class="x-label" x="{_n((f.left + f.right) / 2)}" y="{_n(f.height - 8)}" text-anchor="middle" '
        f'font-size="{_FONT_PX}" fill="#222">{_t(x_label)}</text>'
    )
    cy = _n((f.top + f.bottom) / 2)
    out.append(
        f'<text class="y-label" x="14" y="{cy}" transform="rotate(-90 14 {cy})" text-anchor="middle" '
        f'font-size="{_FONT_PX}" fill="#222">{_t(y_label)}</text>'
    )
    out.append("</g>")
    return out


def _legend(f: _Frame, entries: Sequence[tuple[str, str, str]]) -> list[str]:
    """Entries (label, colour, kind: "line" | "dash" | "box" | "band") in one row above the plot area."""
    out = [f'<g class="legend" font-size="{_FONT_PX}" fill="#222">']
    x = float(f.left)
    y = f.top - 14
    for label, color, kind in entries:
        if kind in ("line", "dash"):
            dash = ' stroke-dasharray="5 3"' if kind == "dash" else ""
            out.append(
                f'<line x1="{_n(x)}" y1="{_n(y)}" x2="{_n(x + 18)}" y2="{_n(y)}" stroke="{color}" '
                f'stroke-width="2.5"{dash}/>'
            )
        else:
            opacity = ' fill-opacity="0.35"' if kind == "band" else ""
            out.append(
                f'<rect x="{_n(x)}" y="{_n(y - 5)}" width="14" height="10" fill="{color}"{opacity} stroke="#888" '
                'stroke-width="0.5"/>'
            )
        out.append(f'<text x="{_n(x + 22)}" y="{_n(y)}" dominant-baseline="middle">{_t(label)}</text>')
        x += 22 + len(label) * _CHAR_PX + 18
    out.append("</g>")
    return out


def _bands(f: _Frame, bands: Sequence[Band]) -> list[str]:
    out = []
    for b in bands:
        x0, x1 = max(b.x0, f.x0), min(b.x1, f.x1)
        if not (math.isfinite(x0) and math.isfinite(x1)) or x1 <= x0:
            continue
        out.append(
            f'<rect class="band" x="{_n(f.px(x0))}" y="{_n(f.top)}" width="{_n(f.px(x1) - f.px(x0))}" '
            f'height="{_n(f.bottom - f.top)}" fill="#bbbbbb" fill-opacity="0.35"><title>{_t(b.label)}</title></rect>'
        )
    return out


def _svg_open(width: int, height: int, title: str, chart_id: str, standalone: bool = False) -> str:
    # a file needs the namespace that an <svg> inlined in HTML inherits (and the report names no URL)
    ns = 'xmlns="http://www.w3.org/2000/svg" ' if standalone else ""
    return (
        f'<svg {ns}class="chart" id="{_t(chart_id)}" viewBox="0 0 {width} {height}" width="{width}" height="{height}" '
        f'role="img" aria-label="{_t(title)}" font-family="system-ui, -apple-system, Segoe UI, Helvetica, Arial, '
        f'sans-serif"><title>{_t(title)}</title>'
    )


def line_chart(
    lines: Sequence[Line],
    *,
    title: str,
    chart_id: str,
    x_label: str,
    y_label: str,
    x_range: tuple[float, float] | None = None,
    y_floor: float = 0.0,
    bands: Sequence[Band] = (),
    width: int = 960,
    height: int = 250,
    standalone: bool = False,
) -> str:
    """Lines over a shared x axis; y starts at 0 and reaches at least ``y_floor`` (100 for a % axis).

    ``standalone``: for an ``.svg`` file rather than inline HTML (declares the SVG namespace)."""
    xs = [x for ln in lines for x in ln.xs if math.isfinite(x)]
    ys = [y for ln in lines for y in ln.ys if math.isfinite(y)]
    xr = x_range or ((min(xs), max(xs)) if xs else (0.0, 1.0))
    f = _Frame(width, height, xr, (0.0, nice_max(max(ys, default=0.0), y_floor)))
    out = [_svg_open(width, height, title, chart_id, standalone)]
    out += _bands(f, bands)
    out += _axes(f, x_label, y_label, nice_ticks(f.x0, f.x1, 8), nice_ticks(f.y0, f.y1, 5))
    for ln in lines:
        dash = ' stroke-dasharray="5 3"' if ln.dashed else ""
        out.append(f'<g class="series" data-label="{_t(ln.label)}">')
        for seg in _segments(ln.xs, ln.ys):
            if len(seg) == 1:  # an isolated reading between gaps: a dot, or it would not show at all
                x, y = seg[0]
                out.append(f'<circle cx="{_n(f.px(x))}" cy="{_n(f.py(y))}" r="2" fill="{ln.color}"/>')
                continue
            pts = " ".join(f"{_n(f.px(x))},{_n(f.py(y))}" for x, y in seg)
            out.append(
                f'<polyline points="{pts}" fill="none" stroke="{ln.color}" stroke-width="1.8" '
                f'stroke-linejoin="round"{dash}/>'
            )
        out.append("</g>")
    legend = [(ln.label, ln.color, "dash" if ln.dashed else "line") for ln in lines]
    legend += [(b.label, "#bbbbbb", "band") for b in bands[:1]]
    out += _legend(f, legend)
    out.append("</svg>")
    return "".join(out)


def _segments(xs: Sequence[float], ys: Sequence[float]) -> list[list[tuple[float, float]]]:
    """Runs of finite points; a NaN or infinite value ends a run (a gap in the line)."""
    segs: list[list[tuple[float, float]]] = []
    cur: list[tuple[float, float]] = []
    for x, y in zip(xs, ys, strict=True):
        if math.isfinite(x) and math.isfinite(y):
            cur.append((x, y))
        elif cur:
            segs.append(cur)
            cur = []
    if cur:
        segs.append(cur)
    return segs


def stacked_bars(
    starts: Sequence[float],
    ends: Sequence[float],
    stacks: Sequence[Stack],
    *,
    title: str,
    chart_id: str,
    x_label: str,
    y_label: str,
    muted: Sequence[bool] = (),
    bands: Sequence[Band] = (),
    width: int = 960,
    height: int = 270,
) -> str:
    """Bar ``i`` spans ``[starts[i], ends[i])`` on the x axis; layers stack bottom-up in ``stacks`` order.

    ``muted[i]`` draws bar ``i`` paler (warm-up steps), beside any ``bands`` shaded behind the bars.
    """
    n = len(starts)
    if len(ends) != n or any(len(s.values) != n for s in stacks) or (muted and len(muted) != n):
        raise ValueError("stacked_bars: starts, ends, every stack and muted must have one entry per bar")
    heights = [math.fsum(v for s in stacks if math.isfinite(v := s.values[i]) and v > 0) for i in range(n)]
    xr = (min(starts), max(ends)) if n else (0.0, 1.0)
    f = _Frame(width, height, xr, (0.0, nice_max(max(heights, default=0.0))))
    out = [_svg_open(width, height, title, chart_id)]
    out += _bands(f, bands)
    out += _axes(f, x_label, y_label, nice_ticks(f.x0, f.x1, 8), nice_ticks(f.y0, f.y1, 5))
    out.append('<g class="bars">')
    for i in range(n):
        x0, x1 = f.px(starts[i]), f.px(ends[i])
        gap = 0.15 * (x1 - x0) if x1 - x0 > 3 else 0.0  # separate wide bars; thin ones would vanish
        opacity = ' fill-opacity="0.45"' if muted and muted[i] else ""
        base = 0.0
        for s in stacks:
            v = s.values[i]
            if not (math.isfinite(v) and v > 0):
                continue
            y_top, y_bottom = f.py(base + v), f.py(base)
            out.append(
                f'<rect x="{_n(x0 + gap / 2)}" y="{_n(y_top)}" width="{_n(max(0.5, x1 - x0 - gap))}" '
                f'height="{_n(max(0.0, y_bottom - y_top))}" fill="{s.color}"{opacity} data-part="{_t(s.label)}"/>'
            )
            base += v
    out.append("</g>")
    legend = [(s.label, s.color, "box") for s in stacks] + [(b.label, "#bbbbbb", "band") for b in bands[:1]]
    out += _legend(f, legend)
    out.append("</svg>")
    return "".join(out)
