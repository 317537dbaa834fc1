"""Server-side SVG charts: plain markup built here, no script, no external asset (the CSP allows neither).

Small on purpose: a bar per value with its label and a title, scaled to the largest value. Text is
escaped; numbers are formatted here, so a chart says what the table beside it says.
"""

from __future__ import annotations

from collections.abc import Sequence
from html import escape

from django.utils.safestring import SafeString, mark_safe

__all__ = ["bar_chart"]

WIDTH, HEIGHT, PAD, LABEL_H = 640, 180, 36, 28


def bar_chart(points: Sequence[tuple[str, float | None]], *, title: str, unit: str = "") -> SafeString:
    """``points`` oldest first as (label, value); a None value (not resumed) is drawn as an empty slot."""
    values = [v for _, v in points if v is not None]
    top = max(values) if values else 1.0
    top = top if top > 0 else 1.0
    n = max(len(points), 1)
    plot_w, plot_h = WIDTH - 2 * PAD, HEIGHT - PAD - LABEL_H
    slot = plot_w / n
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {WIDTH} {HEIGHT}" role="img" '
             f'class="chart" aria-labelledby="chart-title"><title id="chart-title">{escape(title)}</title>',
             f'<text x="{PAD}" y="16" class="chart-caption">{escape(title)} (max {top:.1f}{escape(unit)})</text>',
             f'<line x1="{PAD}" y1="{HEIGHT - LABEL_H}" x2="{WIDTH - PAD}" y2="{HEIGHT - LABEL_H}" '
             'stroke="currentColor" stroke-opacity="0.4"/>']
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
            parts.append(f'<text x="{x + w / 2:.1f}" y="{HEIGHT - 10}" text-anchor="middle" '
                         f'class="chart-label">{escape(label)}</text>')
    parts.append("</svg>")
    return mark_safe("".join(parts))  # noqa: S308 - every text above is escaped
