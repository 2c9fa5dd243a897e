"""The cluster benchmark's picture, as plain SVG text (no plotting library).

Two panels against the node count N: per-node loader images/s reading straight from the file
server and from the staged local copy; staging seconds for replicate and fan-out (partition
too when measured).
"""

from __future__ import annotations

from collections.abc import Sequence
from xml.sax.saxutils import escape

W, H, PANEL_W, TOP, BOTTOM, LEFT = 820, 380, 330, 60, 60, 70
Series = tuple[str, str, Sequence[float | None]]  # label, colour, one value per N


def _panel(x0: int, ns: Sequence[int], series: Sequence[Series], ylabel: str,
           title: str) -> list[str]:
    plot_h = H - TOP - BOTTOM
    vals = [v for _, _, ys in series for v in ys if v is not None]
    peak = max(vals, default=1.0) * 1.1 or 1.0
    xs = {n: x0 + 20 + (PANEL_W - 40) * i / max(len(ns) - 1, 1) for i, n in enumerate(ns)}
    out = [f'<text x="{x0}" y="{TOP - 14}" font-weight="bold">{escape(title)}</text>',
           f'<line x1="{x0}" y1="{TOP}" x2="{x0}" y2="{TOP + plot_h}" stroke="black"/>',
           f'<line x1="{x0}" y1="{TOP + plot_h}" x2="{x0 + PANEL_W}" y2="{TOP + plot_h}" '
           'stroke="black"/>',
           f'<text x="{x0 - 50}" y="{TOP + plot_h / 2}" transform="rotate(-90 {x0 - 50} '
           f'{TOP + plot_h / 2})" text-anchor="middle">{escape(ylabel)}</text>',
           f'<text x="{x0 + PANEL_W / 2}" y="{H - 18}" text-anchor="middle">nodes (N)</text>']
    for k in range(5):
        y = TOP + plot_h - plot_h * k / 4
        out.append(f'<text x="{x0 - 6}" y="{y + 4:.1f}" text-anchor="end">'
                   f'{peak * k / 4:.0f}</text>')
        out.append(f'<line x1="{x0}" y1="{y:.1f}" x2="{x0 + PANEL_W}" y2="{y:.1f}" '
                   'stroke="#ddd"/>')
    for n, x in xs.items():
        out.append(f'<text x="{x:.1f}" y="{TOP + plot_h + 18}" text-anchor="middle">{n}</text>')
    for j, (label, colour, ys) in enumerate(series):
        pts = [(xs[n], TOP + plot_h - plot_h * v / peak) for n, v in zip(ns, ys, strict=True)
               if v is not None]
        if len(pts) > 1:
            path = " ".join(f"{x:.1f},{y:.1f}" for x, y in pts)
            out.append(f'<polyline points="{path}" fill="none" stroke="{colour}" '
                       'stroke-width="2"/>')
        out += [f'<circle cx="{x:.1f}" cy="{y:.1f}" r="4" fill="{colour}"/>' for x, y in pts]
        ly = TOP + 8 + 18 * j
        out.append(f'<rect x="{x0 + PANEL_W - 130}" y="{ly}" width="12" height="12" '
                   f'fill="{colour}"/>')
        out.append(f'<text x="{x0 + PANEL_W - 112}" y="{ly + 10}">{escape(label)}</text>')
    return out


def cluster_svg(ns: Sequence[int], rates: Sequence[Series], staging: Sequence[Series],
                title: str) -> str:
    """Left: per-node images/s against N; right: staging seconds against N."""
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" '
           'font-family="sans-serif" font-size="12">',
           f'<rect width="{W}" height="{H}" fill="white"/>',
           f'<text x="{LEFT}" y="22" font-size="14" font-weight="bold">{escape(title)}</text>']
    out += _panel(LEFT, ns, rates, "images/s per node", "loader, per node")
    out += _panel(LEFT + PANEL_W + 90, ns, staging, "seconds", "staging the set")
    out.append("</svg>")
    return "\n".join(out) + "\n"
