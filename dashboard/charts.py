"""Server-side SVG charts: plain markup built here, no script, no external asset (the CSP allows neither).

Three shapes, small on purpose: ``bar_chart`` (a bar per value, e.g. time to resume per recovery),
``line_chart`` (values over a time window, one line per series, or stacked areas for counts that add up,
e.g. instances per status) and ``waterfall_chart`` (a task's trace: a bar per span, offset and width by time).
Text is escaped; numbers are formatted here, so a chart says what the table beside it says. A hole in the data
(no sample, no heartbeat yet) is drawn as a break in the line, never bridged. Each chart names its ``<title>``
by ``chart_id`` so several charts can share a page.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from html import escape
from typing import Any

from django.utils.safestring import SafeString, mark_safe

__all__ = ["bar_chart", "line_chart", "waterfall_chart"]

WIDTH, HEIGHT, PAD, LABEL_H = 640, 180, 36, 28
LEGEND_H = 16  # line charts: a legend row under the caption
MIN_SLOTS = 10  # bar charts: the narrowest a bar gets is a tenth of the plot
LABEL_CHAR_W = 6.5  # an 11 px label's average character width: what a bar's slot can hold without overlapping
SLIVER = 0.1  # line charts: a first sample later than this share of the window starts the axis (see line_chart)


def _open(title: str, caption: str, chart_id: str, height: int = HEIGHT) -> list[str]:
    return [f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {WIDTH} {height}" role="img" '
            f'class="chart" aria-labelledby="{escape(chart_id)}-title"><title id="{escape(chart_id)}-title">'
            f'{escape(title)}</title>',
            f'<text x="{PAD}" y="16" class="chart-caption">{escape(caption)}</text>']


def bar_chart(points: Sequence[tuple[str, float | None]], *, title: str, unit: str = "",
              chart_id: str = "chart") -> SafeString:
    """``points`` oldest first as (label, value); a None value (not resumed) is drawn as an empty slot."""
    values = [v for _, v in points if v is not None]
    top = max(values) if values else 1.0
    top = top if top > 0 else 1.0
    n = max(len(points), 1)
    plot_w, plot_h = WIDTH - 2 * PAD, HEIGHT - PAD - LABEL_H
    slot = plot_w / max(n, MIN_SLOTS)  # one recovery is a bar, not a wall: few bars keep a bar's width
    parts = _open(title, f"{title} (max {top:.1f}{unit})", chart_id)
    parts.append(f'<line x1="{PAD}" y1="{HEIGHT - LABEL_H}" x2="{WIDTH - PAD}" y2="{HEIGHT - LABEL_H}" '
                 'stroke="currentColor" stroke-opacity="0.4"/>')
    for i, (label, value) in enumerate(points):
        x = PAD + i * slot + slot * 0.15
        w = slot * 0.7
        if value is None:
            parts.append(f'<rect x="{x:.1f}" y="{HEIGHT - LABEL_H - 4}" width="{w:.1f}" height="4" '
                         f'class="bar-missing"><title>{escape(label)}: not resumed</title></rect>')
        else:
            h = max(1.0, plot_h * value / top)
            parts.append(f'<rect x="{x:.1f}" y="{HEIGHT - LABEL_H - h:.1f}" width="{w:.1f}" height="{h:.1f}" '
                         f'class="bar"><title>{escape(label)}: {value:.1f}{escape(unit)}</title></rect>')
        if n <= 12:
            # A label longer than its slot is cut (the bar's tooltip keeps it whole): "tenant-slug 12:34" under
            # ten bars overlapped its neighbours (issue 37).
            room = max(int(slot / LABEL_CHAR_W) - 1, 1)
            shown = label if len(label) <= room else label[:room - 1] + "…"
            parts.append(f'<text x="{x + w / 2:.1f}" y="{HEIGHT - 10}" text-anchor="middle" '
                         f'class="chart-label">{escape(shown)}</text>')
    parts.append("</svg>")
    return mark_safe("".join(parts))  # noqa: S308 - every text above is escaped


def _runs(times: Sequence[datetime], present: Sequence[bool], gap_s: float | None) -> list[list[int]]:
    """Indices split into unbroken runs: a missing value or a gap longer than ``gap_s`` ends a run."""
    runs: list[list[int]] = []
    current: list[int] = []
    for i, ok in enumerate(present):
        if not ok:
            current = []
            continue
        if current and gap_s is not None and (times[i] - times[current[-1]]).total_seconds() > gap_s:
            current = []
        if not current:
            runs.append(current)
        current.append(i)
    return runs


def _key(name: str) -> str:
    """A CSS class from a series name ("heartbeat age" -> "k-heartbeat-age"): colours by meaning, not position."""
    return "k-" + "".join(c if c.isalnum() else "-" for c in name.lower())


def _fmt(value: float) -> str:
    return f"{value:.0f}" if value == int(value) else f"{value:.1f}"


def _when(t: datetime) -> str:
    """An axis label with its date ("Dec 5 14:30"): a time alone did not say which day a 24 h window began."""
    return f"{t:%b} {t.day} {t:%H:%M}"


def line_chart(times: Sequence[datetime], series: Sequence[tuple[str, Sequence[float | None]]], *,
               start: datetime, end: datetime, title: str, unit: str = "", stacked: bool = False,
               gap_s: float | None = None, chart_id: str = "chart") -> SafeString:
    """Values over the window ``start``..``end``: a hole inside it is drawn as a hole, but when nothing at all was
    sampled before the first sample (a new install, a sampler just started) the axis starts at that sample and
    the caption says since when; a 24 h axis was a sliver at its right edge (issue 37). The axis's first and
    last labels carry the date.

    ``times`` oldest first; each series is (name, one value per time, None where unknown). ``stacked``
    draws cumulative areas (counts that add up to a whole); otherwise one polyline per series. Two
    neighbouring samples further apart than ``gap_s`` are not joined.
    """
    since = times[0] if times and (times[0] - start) > (end - start) * SLIVER else None
    if since is not None:
        start = since
    span = max((end - start).total_seconds(), 1.0)
    top_y = PAD + LEGEND_H
    base_y = HEIGHT + LEGEND_H - LABEL_H
    plot_w, plot_h = WIDTH - 2 * PAD, base_y - top_y
    if stacked:
        totals = [sum(vals[i] or 0.0 for _, vals in series) for i in range(len(times))]
        peak = max(totals, default=0.0)
    else:
        peak = max((v for _, vals in series for v in vals if v is not None), default=0.0)
    top = peak if peak > 0 else 1.0

    def x(t: datetime) -> float:
        return PAD + plot_w * min(max((t - start).total_seconds() / span, 0.0), 1.0)

    def y(v: float) -> float:
        return base_y - plot_h * v / top

    summary = "; ".join(
        f"{name}: latest {_fmt(latest)}{unit}" if (latest := next((v for v in reversed(vals) if v is not None),
                                                                  None)) is not None else f"{name}: no data"
        for name, vals in series)
    caption = f"{title} (max {_fmt(peak)}{unit}" + (f"; sampled since {_when(since)})" if since else ")")
    parts = _open(title, caption, chart_id, HEIGHT + LEGEND_H)
    parts.append(f"<desc>{escape(summary)}</desc>")
    for i, (name, vals) in enumerate(series):  # legend: a swatch and the latest value per series
        lx = PAD + i * (plot_w / max(len(series), 1))
        latest = next((v for v in reversed(vals) if v is not None), None)
        text = f"{name} {_fmt(latest)}{unit}" if latest is not None else f"{name} -"
        parts.append(f'<rect x="{lx:.1f}" y="{PAD - 6}" width="10" height="10" class="swatch s{i} {_key(name)}"/>'
                     f'<text x="{lx + 14:.1f}" y="{PAD + 3}" class="chart-label">{escape(text)}</text>')
    parts.append(f'<line x1="{PAD}" y1="{base_y}" x2="{WIDTH - PAD}" y2="{base_y}" '
                 'stroke="currentColor" stroke-opacity="0.4"/>')
    if stacked:
        runs = _runs(times, [True] * len(times), gap_s)
        lower = [0.0] * len(times)
        for i, (name, vals) in enumerate(series):
            upper = [lower[k] + (vals[k] or 0.0) for k in range(len(times))]
            for run in runs:
                if not any(vals[k] for k in run):
                    continue
                edge = " ".join(f"{x(times[k]):.1f},{y(upper[k]):.1f}" for k in run)
                floor = " ".join(f"{x(times[k]):.1f},{y(lower[k]):.1f}" for k in reversed(run))
                parts.append(f'<polygon points="{edge} {floor}" class="area s{i} {_key(name)}"><title>{escape(name)}'
                             f'</title></polygon>')
            lower = upper
    else:
        for i, (name, vals) in enumerate(series):
            for run in _runs(times, [v is not None for v in vals], gap_s):
                if len(run) == 1:
                    k = run[0]
                    parts.append(f'<circle cx="{x(times[k]):.1f}" cy="{y(vals[k] or 0.0):.1f}" r="2" '
                                 f'class="dot s{i} {_key(name)}"><title>{escape(name)}</title></circle>')
                    continue
                points = " ".join(f"{x(times[k]):.1f},{y(vals[k] or 0.0):.1f}" for k in run)
                parts.append(f'<polyline points="{points}" class="line s{i} {_key(name)}" fill="none">'
                             f'<title>{escape(name)}</title></polyline>')
    middle = start + (end - start) / 2
    ticks = ((start, "start", _when(start)), (middle, "middle", _when(middle) if span > 86400 else f"{middle:%H:%M}"),
             (end, "end", f"{_when(end)} UTC"))
    for t, anchor, text in ticks:
        parts.append(f'<text x="{x(t):.1f}" y="{HEIGHT + LEGEND_H - 10}" text-anchor="{anchor}" '
                     f'class="chart-label">{escape(text)}</text>')
    parts.append("</svg>")
    return mark_safe("".join(parts))  # noqa: S308 - every text above is escaped


WATERFALL_ROW = 20
WATERFALL_NAME_W = 250  # the span names' column; the bars get what is left but the duration column
WATERFALL_TIME_W = 70


def waterfall_chart(rows: Sequence[Mapping[str, Any]], *, title: str, chart_id: str = "trace") -> SafeString:
    """A trace as a waterfall: one row per span in tree order (``conversations.screens.trace_rows``: ``name``,
    ``depth``, ``offset_ms`` from the first span's start, ``duration_ms``, ``tokens`` or None, ``status``), its bar
    offset and as wide as its time on a shared axis, its name indented by depth, its duration at the right."""
    total = max((float(r["offset_ms"]) + float(r["duration_ms"]) for r in rows), default=0.0)
    total = total if total > 0 else 1.0
    height = PAD + len(rows) * WATERFALL_ROW + 8
    bar_x0, bar_x1 = WATERFALL_NAME_W, WIDTH - WATERFALL_TIME_W - 6
    plot_w = bar_x1 - bar_x0
    parts = _open(title, f"{title} ({_ms(total)}, {len(rows)} spans)", chart_id, height)
    parts.append(f'<line x1="{bar_x0}" y1="{PAD - 8}" x2="{bar_x0}" y2="{height - 4}" stroke="currentColor" '
                 'stroke-opacity="0.3"/>')
    for i, r in enumerate(rows):
        y = PAD + i * WATERFALL_ROW
        x = bar_x0 + plot_w * float(r["offset_ms"]) / total
        w = max(1.5, plot_w * float(r["duration_ms"]) / total)
        name = str(r["name"])
        tokens = r.get("tokens")
        label = name if len(name) <= 34 - 2 * int(r["depth"]) else name[:33 - 2 * int(r["depth"])] + "…"
        if tokens:
            label += f" · {tokens} tok"
        tip = f"{name}: {_ms(float(r['duration_ms']))} at +{_ms(float(r['offset_ms']))}"
        tip += f", {tokens} tokens" if tokens else ""
        kind = "bar-error" if r.get("status") == "error" else "bar"
        parts.append(f'<g class="span-row" data-span="{escape(name)}">'
                     f'<text x="{4 + 10 * int(r["depth"])}" y="{y + 13}" class="chart-label">{escape(label)}</text>'
                     f'<rect x="{min(x, bar_x1 - w):.1f}" y="{y + 3}" width="{w:.1f}" height="{WATERFALL_ROW - 6}" '
                     f'class="{kind}"><title>{escape(tip)}</title></rect>'
                     f'<text x="{WIDTH - 4}" y="{y + 13}" text-anchor="end" class="chart-label">'
                     f'{escape(_ms(float(r["duration_ms"])))}</text></g>')
    parts.append("</svg>")
    return mark_safe("".join(parts))  # noqa: S308 - every text above is escaped


def _ms(value: float) -> str:
    return f"{value / 1000:.2f} s" if value >= 1000 else f"{value:.1f} ms"
