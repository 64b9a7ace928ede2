"""Point labels that never overlap: what every scatter plot of the project uses to name its points."""

from __future__ import annotations

from typing import Sequence


def label_points(
    ax, xs: Sequence[float], ys: Sequence[float], labels: Sequence[str], fontsize: float = 7, **text_kw
) -> list:
    """Write each point's label beside it where no other label is: candidate places at growing
    distances around the point (right first), the first whose box meets no box already placed and
    no marker is taken, with a thin leader line when it is away from the point. Call after the axes'
    limits and scales are final (the boxes are measured in display space). Returns the texts."""
    fig = ax.figure
    fig.canvas.draw()  # a renderer, and the final transforms
    renderer = fig.canvas.get_renderer()
    points = ax.transData.transform(list(zip(xs, ys)))
    marker = 4.0  # display pixels around each point kept free
    taken = [(px - marker, py - marker, px + marker, py + marker) for px, py in points]
    texts = []

    def clear(box) -> bool:
        return all(box[2] <= b[0] or box[0] >= b[2] or box[3] <= b[1] or box[1] >= b[3] for b in taken)

    for (px, py), label in zip(points, labels):
        probe = ax.text(0, 0, label, fontsize=fontsize, transform=None)
        bb = probe.get_window_extent(renderer)
        w, h = bb.width, bb.height
        probe.remove()
        best = None
        for r in (6, 14, 24, 36, 50, 66, 84):
            for dx, dy in ((1, 0), (1, 1), (1, -1), (0, 1), (0, -1), (-1, 0), (-1, 1), (-1, -1)):
                x0 = px + dx * r - (w if dx < 0 else w / 2 if dx == 0 else 0)
                y0 = py + dy * r - (h if dy < 0 else h / 2 if dy == 0 else 0)
                box = (x0, y0, x0 + w, y0 + h)
                if clear(box):
                    best = (box, r)
                    break
            if best:
                break
        if best is None:  # crowded: stack it above everything placed so far
            top = max(b[3] for b in taken) + 2
            best = ((px, top, px + w, top + h), 99)
        box, r = best
        taken.append(box)
        xy = ax.transData.inverted().transform((box[0], box[1]))
        arrow = dict(arrowprops=dict(arrowstyle="-", lw=0.4, color="grey")) if r > 14 else {}
        texts.append(
            ax.annotate(
                label,
                xy=(ax.transData.inverted().transform((px, py))),
                xytext=xy,
                textcoords="data",
                fontsize=fontsize,
                ha="left",
                va="bottom",
                **arrow,
                **text_kw,
            )
        )
    return texts


__all__ = ["label_points"]
