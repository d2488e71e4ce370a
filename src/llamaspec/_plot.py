"""`llamaspec bench --plot out.svg`: the bench's rows as a standalone SVG (no dependency).

Two panels over the draft lengths measured (numbers in order, then "auto", a point apart from the
line of each method): tokens/s per method, with
plain decoding as a dashed line, and the acceptance per method. Every point carries a <title> with
its figure, so the file reads in a browser, an editor or a test.
"""

from __future__ import annotations

from typing import Any
from xml.sax.saxutils import escape as _escape

WIDTH, PANEL_H, TOP, LEFT, RIGHT = 640, 220, 56, 56, 130
COLORS = ["#1a5fb4", "#2e8540", "#c64600", "#813d9c", "#986a44", "#e01b24"]


def escape(text: str) -> str:
    """Text for an SVG element or a double-quoted attribute (control characters dropped: XML 1.0
    has no place for them)."""
    return _escape("".join(c for c in text if c >= " " or c in "\t\n"), {'"': "&quot;"})


def _x_order(rows: list[dict[str, Any]]) -> list[str]:
    lengths = {str(r["n_draft"]) for r in rows if r["config"] != "plain"}
    numbers = sorted((n for n in lengths if n != "auto"), key=int)
    return numbers + (["auto"] if "auto" in lengths else [])


def _nice_max(v: float) -> float:
    """A round axis top at or above v."""
    if v <= 0:
        return 1.0
    step = 10 ** (len(str(int(v))) - 1)
    return float(((int(v) // step) + 1) * step) if v >= 1 else 1.0


def bench_svg(rows: list[dict[str, Any]], title: str, subtitle: str = "") -> str:
    """The SVG document for ``llamaspec bench``'s rows (its --json "rows")."""
    xs = _x_order(rows)
    methods = list(dict.fromkeys(r["config"].rsplit(" ", 1)[0] for r in rows if r["config"] != "plain"))
    plain = next((r["tokens_per_second"] for r in rows if r["config"] == "plain"), 0.0)
    plot_w = WIDTH - LEFT - RIGHT
    step = plot_w / max(1, len(xs))

    def x_of(n: str) -> float:
        return LEFT + step * (xs.index(n) + 0.5)

    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{TOP + 2 * PANEL_H + 40}" '
        f'viewBox="0 0 {WIDTH} {TOP + 2 * PANEL_H + 40}" font-family="sans-serif" font-size="12">',
        '<rect width="100%" height="100%" fill="#ffffff"/>',
        f'<text x="{LEFT}" y="22" font-size="15" font-weight="bold">{escape(title)}</text>',
        f'<text x="{LEFT}" y="40" fill="#555">{escape(subtitle)}</text>',
    ]
    top_rate = _nice_max(max([plain] + [r["tokens_per_second"] for r in rows]))
    panels: list[tuple[str, str, float, Any]] = [
        ("tokens/s", "tokens_per_second", top_rate, lambda v: f"{v:.1f} tok/s"),
        ("acceptance", "acceptance_rate", 1.0, lambda v: f"{v:.0%} accepted"),
    ]
    for i, (name, key, top, show) in enumerate(panels):
        y0 = TOP + i * PANEL_H + 22
        h = PANEL_H - 62

        def y_of(v: float, y0: float = y0, h: float = h, top: float = top) -> float:
            return y0 + h - min(v, top) / top * h

        out.append(f'<g class="panel" data-panel="{key}">')
        out.append(f'<text x="{LEFT}" y="{y0 - 10}" font-weight="bold">{name}</text>')
        for k in range(5):  # grid and y labels
            v = top * k / 4
            y = y_of(v)
            label = f"{v:.0%}" if key == "acceptance_rate" else f"{v:g}"
            out.append(f'<line x1="{LEFT}" x2="{LEFT + plot_w}" y1="{y:.1f}" y2="{y:.1f}" stroke="#ddd"/>')
            out.append(f'<text x="{LEFT - 6}" y="{y + 4:.1f}" text-anchor="end" fill="#555">{label}</text>')
        for n in xs:
            out.append(f'<text x="{x_of(n):.1f}" y="{y0 + h + 16}" text-anchor="middle" fill="#555">'
                       f'{escape(n)}</text>')
        out.append(f'<text x="{LEFT + plot_w / 2:.1f}" y="{y0 + h + 32}" text-anchor="middle" '
                   f'fill="#555">draft length</text>')
        if key == "tokens_per_second" and plain > 0:
            y = y_of(plain)
            out.append(f'<line x1="{LEFT}" x2="{LEFT + plot_w}" y1="{y:.1f}" y2="{y:.1f}" stroke="#333" '
                       f'stroke-dasharray="5 4"><title>plain: {plain:.1f} tok/s</title></line>')
            out.append(f'<text x="{LEFT + plot_w + 6}" y="{y + 4:.1f}" fill="#333">plain</text>')
        for m, method in enumerate(methods):
            color = COLORS[m % len(COLORS)]
            points = sorted([(x_of(str(r["n_draft"])), r) for r in rows if r["config"] != "plain"
                             and r["config"].rsplit(" ", 1)[0] == method and key in r], key=lambda p: p[0])
            if not points:
                continue
            # a line over the fixed lengths; "auto" stands apart (it is no point on that axis)
            path = " ".join(f"{x:.1f},{y_of(r[key]):.1f}" for x, r in points if r["n_draft"] != "auto")
            out.append(f'<polyline class="method" data-method="{escape(method)}" points="{path}" fill="none" '
                       f'stroke="{color}" stroke-width="2"/>')
            for x, r in points:
                out.append(f'<circle cx="{x:.1f}" cy="{y_of(r[key]):.1f}" r="4" fill="{color}">'
                           f'<title>{escape(r["config"])}: {show(r[key])}</title></circle>')
            ly = y0 + 14 + 16 * m
            out.append(f'<rect x="{LEFT + plot_w + 6}" y="{ly - 9}" width="10" height="10" fill="{color}"/>')
            out.append(f'<text x="{LEFT + plot_w + 20}" y="{ly}">{escape(method)}</text>')
        out.append("</g>")
    out.append("</svg>")
    return "\n".join(out) + "\n"
