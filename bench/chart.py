"""An SVG picture of throughput and the per-iteration time split, per process count.

Plain SVG text: no plotting library, and nothing that could pull in stock Pillow.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any
from xml.sax.saxutils import escape

COLORS = {"data": "#e3a21a", "compute": "#2b7bba", "allreduce": "#d7301f",
          "optimizer": "#6a51a3"}
LABELS = {"data": "data wait", "compute": "forward+backward", "allreduce": "exposed all-reduce",
          "optimizer": "optimizer"}


def scaling_svg(rows: Sequence[dict[str, Any]], title: str) -> str:
    """One stacked bar (ms per iteration, by phase) per process count, labelled with images/s.

    ``rows``: ``{"procs": p, "images_per_s": x, "split_ms": {phase: ms}}``.
    """
    width, height, left, top, bottom = 640, 360, 70, 50, 60
    plot_h = height - top - bottom
    peak = max((sum(r["split_ms"].values()) for r in rows), default=1.0) or 1.0
    bar_w = min(120, (width - left - 180) // max(len(rows), 1) - 30)
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
           'font-family="sans-serif" font-size="12">',
           f'<rect width="{width}" height="{height}" fill="white"/>',
           f'<text x="{left}" y="24" font-size="15" font-weight="bold">{escape(title)}</text>',
           f'<line x1="{left}" y1="{top}" x2="{left}" y2="{top + plot_h}" stroke="black"/>',
           f'<line x1="{left}" y1="{top + plot_h}" x2="{width - 170}" y2="{top + plot_h}" '
           'stroke="black"/>']
    for k in range(5):
        v = peak * k / 4
        y = top + plot_h - plot_h * k / 4
        out.append(f'<text x="{left - 6}" y="{y + 4:.1f}" text-anchor="end">{v:.0f}</text>')
    out.append(f'<text x="16" y="{top + plot_h / 2}" transform="rotate(-90 16 '
               f'{top + plot_h / 2})" text-anchor="middle">ms per iteration</text>')
    for i, r in enumerate(rows):
        x = left + 30 + i * (bar_w + 30)
        y = top + plot_h
        for phase in COLORS:
            h = plot_h * r["split_ms"].get(phase, 0.0) / peak
            y -= h
            out.append(f'<rect x="{x}" y="{y:.1f}" width="{bar_w}" height="{h:.1f}" '
                       f'fill="{COLORS[phase]}"/>')
        out.append(f'<text x="{x + bar_w / 2}" y="{y - 6:.1f}" text-anchor="middle">'
                   f'{r["images_per_s"]:.1f} img/s</text>')
        out.append(f'<text x="{x + bar_w / 2}" y="{top + plot_h + 18}" text-anchor="middle">'
                   f'{r["procs"]} process{"es" if r["procs"] > 1 else ""}</text>')
    for j, phase in enumerate(COLORS):
        y = top + 10 + j * 22
        out.append(f'<rect x="{width - 160}" y="{y}" width="14" height="14" '
                   f'fill="{COLORS[phase]}"/>')
        out.append(f'<text x="{width - 140}" y="{y + 11}">{LABELS[phase]}</text>')
    out.append("</svg>")
    return "\n".join(out) + "\n"
