#!/usr/bin/env python3
"""Renders folded stacks (one "root;...;leaf count" line per stack, as
deploy/profile.sh writes them) as a flame graph SVG: each frame a box as wide
as its share of the samples, its callees stacked on it; hover a box for its
name and share. Standard library only, so profiling needs nothing but perf.

usage: flamegraph.py folded.txt > flame.svg
"""

import html
import sys

WIDTH = 1600
ROW = 16
MIN_PX = 0.5  # boxes narrower than this are not drawn (their parents are)


def build(path):
    root = {"n": 0, "kids": {}}
    for line in open(path):
        line = line.rstrip("\n")
        if not line:
            continue
        stack, count = line.rsplit(" ", 1)
        count = int(count)
        node = root
        node["n"] += count
        for frame in stack.split(";"):
            node = node["kids"].setdefault(frame, {"n": 0, "kids": {}})
            node["n"] += count
    return root


def colour(name):
    h = 0
    for ch in name:
        h = (h * 31 + ord(ch)) & 0xFFFFFF
    return f"rgb({205 + h % 50},{80 + (h >> 8) % 120},{30 + (h >> 16) % 40})"


def main():
    root = build(sys.argv[1])
    total = max(root["n"], 1)
    boxes = []
    depth_max = 0

    def walk(node, name, x, depth):
        nonlocal depth_max
        w = WIDTH * node["n"] / total
        if w < MIN_PX:
            return
        depth_max = max(depth_max, depth)
        boxes.append((name, x, depth, w, node["n"]))
        kx = x
        for kid_name, kid in sorted(node["kids"].items()):
            walk(kid, kid_name, kx, depth + 1)
            kx += WIDTH * kid["n"] / total

    walk(root, "all", 0.0, 0)
    height = (depth_max + 1) * ROW + 20
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height}" '
        f'font-family="monospace" font-size="11">',
        f'<rect width="{WIDTH}" height="{height}" fill="#fff"/>',
    ]
    for name, x, depth, w, n in boxes:
        y = height - (depth + 1) * ROW
        label = html.escape(name)
        share = 100 * n / total
        out.append(
            f'<g><title>{label} ({n} samples, {share:.2f}%)</title>'
            f'<rect x="{x:.1f}" y="{y}" width="{w:.1f}" height="{ROW - 1}" fill="{colour(name)}"/>'
        )
        chars = int(w / 7)
        if chars >= 3:
            text = name if len(name) <= chars else name[: chars - 2] + ".."
            out.append(f'<text x="{x + 2:.1f}" y="{y + ROW - 4}">{html.escape(text)}</text>')
        out.append("</g>")
    out.append("</svg>")
    sys.stdout.write("\n".join(out) + "\n")


if __name__ == "__main__":
    main()
