"""Small inline SVG charts, written by hand (no plotting library, nothing fetched): a scatter with
the identity line, a histogram, lines with a legend (DVH curves); axes with ticks and labels.

Each function returns one ``<svg>`` element as a string for an HTML page (inline SVG needs no
namespace there). Every text, a tooltip's included, is escaped. Coordinates are written with two
decimals; :func:`frame` gives the mapping from data to pixels that a chart used.
"""

from __future__ import annotations

import dataclasses
import html
import math
from typing import Iterable, Sequence

PALETTE = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22",
           "#17becf")  # ten colours told apart (Tableau's)
MARGIN = {"left": 52.0, "right": 14.0, "top": 26.0, "bottom": 42.0}


def escape(text) -> str:
    """Text for HTML or SVG content and attribute values."""
    return html.escape(str(text), quote=True)


def nice_ticks(low: float, high: float, count: int = 5) -> list[float]:
    """About ``count`` round values (1, 2 or 5 × 10^k apart) spanning [low, high]."""
    if not (math.isfinite(low) and math.isfinite(high)):
        return []
    if high <= low:
        return [low]
    raw = (high - low) / max(1, count)
    power = 10.0 ** math.floor(math.log10(raw))
    step = next(factor * power for factor in (1, 2, 5, 10) if factor * power >= raw)
    first = math.ceil(low / step - 1e-9) * step
    return [round(first + k * step, 12) for k in range(int(math.floor((high - first) / step + 1e-9)) + 1)]


def _padded(values: Iterable[float], pad: float = 0.05) -> tuple[float, float]:
    finite = [v for v in values if v is not None and math.isfinite(v)]
    if not finite:
        return 0.0, 1.0
    low, high = min(finite), max(finite)
    if high == low:
        return low - 1.0, high + 1.0
    span = high - low
    return low - pad * span, high + pad * span


@dataclasses.dataclass(frozen=True)
class Frame:
    """The plotting area of a chart and its data ranges: :meth:`x` and :meth:`y` map data to pixels."""

    width: float
    height: float
    x_range: tuple[float, float]
    y_range: tuple[float, float]

    @property
    def left(self) -> float:
        return MARGIN["left"]

    @property
    def right(self) -> float:
        return self.width - MARGIN["right"]

    @property
    def top(self) -> float:
        return MARGIN["top"]

    @property
    def bottom(self) -> float:
        return self.height - MARGIN["bottom"]

    def x(self, value: float) -> float:
        low, high = self.x_range
        return self.left + (value - low) / (high - low) * (self.right - self.left)

    def y(self, value: float) -> float:
        low, high = self.y_range
        return self.bottom - (value - low) / (high - low) * (self.bottom - self.top)


def frame(width: float, height: float, x_range: tuple[float, float], y_range: tuple[float, float]) -> Frame:
    return Frame(float(width), float(height), (float(x_range[0]), float(x_range[1])),
                 (float(y_range[0]), float(y_range[1])))


def _number(value: float) -> str:
    return f"{value:.2f}"


def _tick_label(value: float) -> str:
    return f"{value:g}" if abs(value) < 1e5 else f"{value:.2g}"


def _axes(area: Frame, title: str, x_label: str, y_label: str) -> list[str]:
    """The frame, ticks with their labels and grid lines, the axis labels and the title."""
    parts = [f'<rect x="{_number(area.left)}" y="{_number(area.top)}" width="{_number(area.right - area.left)}" '
             f'height="{_number(area.bottom - area.top)}" class="plot"/>']
    for value in nice_ticks(*area.x_range):
        x = area.x(value)
        parts.append(f'<line x1="{_number(x)}" y1="{_number(area.top)}" x2="{_number(x)}" y2="{_number(area.bottom)}" '
                     f'class="grid"/>')
        parts.append(f'<text x="{_number(x)}" y="{_number(area.bottom + 14)}" text-anchor="middle" class="tick">'
                     f'{escape(_tick_label(value))}</text>')
    for value in nice_ticks(*area.y_range):
        y = area.y(value)
        parts.append(f'<line x1="{_number(area.left)}" y1="{_number(y)}" x2="{_number(area.right)}" y2="{_number(y)}" '
                     f'class="grid"/>')
        parts.append(f'<text x="{_number(area.left - 5)}" y="{_number(y + 3.5)}" text-anchor="end" class="tick">'
                     f'{escape(_tick_label(value))}</text>')
    middle_x, middle_y = (area.left + area.right) / 2, (area.top + area.bottom) / 2
    parts.append(f'<text x="{_number(middle_x)}" y="{_number(area.height - 8)}" text-anchor="middle" class="label">'
                 f'{escape(x_label)}</text>')
    parts.append(f'<text x="12" y="{_number(middle_y)}" text-anchor="middle" class="label" '
                 f'transform="rotate(-90 12 {_number(middle_y)})">{escape(y_label)}</text>')
    parts.append(f'<text x="{_number(area.left)}" y="16" class="title">{escape(title)}</text>')
    return parts


def _svg(area: Frame, title: str, parts: list[str], extra_width: float = 0.0) -> str:
    width = area.width + extra_width
    return (f'<svg class="chart" width="{_number(width)}" height="{_number(area.height)}" '
            f'viewBox="0 0 {_number(width)} {_number(area.height)}" role="img" aria-label="{escape(title)}">'
            f'<title>{escape(title)}</title>' + "".join(parts) + "</svg>")


def scatter(points: Sequence[tuple[float, float]], *, title: str, x_label: str, y_label: str,
            names: Sequence[str] | None = None, highlighted: Iterable[int] = (), identity: bool = True,
            width: float = 250, height: float = 230) -> str:
    """Points ``(x, y)`` (a tooltip each from ``names``), those at the indices ``highlighted`` drawn
    in red on top; with ``identity`` the line y = x, the two axes on one range."""
    points = [(float(x), float(y)) for x, y in points]
    highlighted = set(highlighted)
    xs, ys = [x for x, _ in points], [y for _, y in points]
    if identity:
        both = _padded(xs + ys)
        area = frame(width, height, both, both)
    else:
        area = frame(width, height, _padded(xs), _padded(ys))
    parts = _axes(area, title, x_label, y_label)
    if identity:
        low, high = area.x_range
        parts.append(f'<line x1="{_number(area.x(low))}" y1="{_number(area.y(low))}" x2="{_number(area.x(high))}" '
                     f'y2="{_number(area.y(high))}" class="identity"/>')
    order = [k for k in range(len(points)) if k not in highlighted] + sorted(k for k in highlighted if k < len(points))
    for k in order:
        x, y = points[k]
        if not (math.isfinite(x) and math.isfinite(y)):
            continue
        tooltip = f"<title>{escape(names[k])}: {x:.2f}, {y:.2f}</title>" if names is not None else ""
        kind = "point flagged" if k in highlighted else "point"
        parts.append(f'<circle cx="{_number(area.x(x))}" cy="{_number(area.y(y))}" r="{3.2 if k in highlighted else 2.4}" '
                     f'class="{kind}">{tooltip}</circle>')
    if not points:
        parts.append(_no_data(area))
    return _svg(area, title, parts)


def histogram_counts(values: Sequence[float], bins: int | None = None) -> tuple[list[float], list[int]]:
    """``(edges, counts)`` of the finite ``values``: ``bins`` equal bins (default: the square root of
    their number, 5 to 30) from the least to the largest; the last bin holds its right edge."""
    finite = sorted(float(v) for v in values if v is not None and math.isfinite(v))
    if not finite:
        return [], []
    bins = bins or max(5, min(30, math.ceil(math.sqrt(len(finite)))))
    low, high = finite[0], finite[-1]
    if high == low:
        low, high = low - 0.5, high + 0.5
    width = (high - low) / bins
    edges = [low + k * width for k in range(bins)] + [high]
    counts = [0] * bins
    for value in finite:
        counts[min(bins - 1, int((value - low) / width))] += 1
    return edges, counts


def histogram(values: Sequence[float], *, title: str, x_label: str, y_label: str = "patients",
              bins: int | None = None, markers: Sequence[tuple[float, str]] = (), width: float = 250,
              height: float = 200) -> str:
    """A histogram of the finite ``values`` (:func:`histogram_counts`), with dashed vertical
    ``markers`` ``(x, label)`` (e.g. thresholds)."""
    edges, counts = histogram_counts(values, bins)
    marker_xs = [float(x) for x, _ in markers]
    x_range = _padded([*edges, *marker_xs], pad=0.03) if edges else _padded(marker_xs)
    area = frame(width, height, x_range, (0.0, max(counts, default=1) * 1.1 or 1.0))
    parts = _axes(area, title, x_label, y_label)
    for left, right, count in zip(edges, edges[1:], counts):
        if count:
            top = area.y(count)
            parts.append(f'<rect x="{_number(area.x(left))}" y="{_number(top)}" '
                         f'width="{_number(max(0.5, area.x(right) - area.x(left) - 0.5))}" '
                         f'height="{_number(area.bottom - top)}" class="bar"><title>{count} in '
                         f'[{left:.2f}, {right:.2f}]</title></rect>')
    for x, label in markers:
        if area.x_range[0] <= x <= area.x_range[1]:
            px = area.x(float(x))
            parts.append(f'<line x1="{_number(px)}" y1="{_number(area.top)}" x2="{_number(px)}" '
                         f'y2="{_number(area.bottom)}" class="marker"/>')
            parts.append(f'<text x="{_number(px + 3)}" y="{_number(area.top + 10)}" class="tick">{escape(label)}</text>')
    if not edges:
        parts.append(_no_data(area))
    return _svg(area, title, parts)


def lines(series: Sequence[dict], *, title: str, x_label: str, y_label: str, width: float = 470,
          height: float = 300, y_range: tuple[float, float] | None = None, legend_width: float = 170) -> str:
    """Lines, each ``{"label", "points": [(x, y), ...], "colour" (optional), "dashed" (optional)}``,
    with a legend to the right naming each (e.g. DVH curves: plan solid, prediction dashed)."""
    xs = [float(x) for entry in series for x, _ in entry["points"]]
    ys = [float(y) for entry in series for _, y in entry["points"]]
    area = frame(width, height, _padded(xs, pad=0.02), y_range or _padded(ys, pad=0.02))
    parts = _axes(area, title, x_label, y_label)
    for k, entry in enumerate(series):
        colour = entry.get("colour") or PALETTE[k % len(PALETTE)]
        dash = ' stroke-dasharray="5 3"' if entry.get("dashed") else ""
        coordinates = " ".join(f"{_number(area.x(float(x)))},{_number(area.y(float(y)))}" for x, y in entry["points"]
                               if math.isfinite(float(x)) and math.isfinite(float(y)))
        parts.append(f'<polyline points="{coordinates}" fill="none" stroke="{escape(colour)}" stroke-width="1.6"{dash}>'
                     f'<title>{escape(entry["label"])}</title></polyline>')
        y = area.top + 6 + 15 * k
        parts.append(f'<line x1="{_number(width + 4)}" y1="{_number(y)}" x2="{_number(width + 28)}" y2="{_number(y)}" '
                     f'stroke="{escape(colour)}" stroke-width="2"{dash}/>')
        parts.append(f'<text x="{_number(width + 33)}" y="{_number(y + 4)}" class="legend">{escape(entry["label"])}</text>')
    if not series:
        parts.append(_no_data(area))
    return _svg(area, title, parts, extra_width=legend_width)


def _no_data(area: Frame) -> str:
    return (f'<text x="{_number((area.left + area.right) / 2)}" y="{_number((area.top + area.bottom) / 2)}" '
            f'text-anchor="middle" class="label">no data</text>')
