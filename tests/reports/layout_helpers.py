"""What a reader sees of a figure's text: every string matplotlib actually draws, with the
box it occupies on the Agg canvas, so a test can say a label is cut off or hides another."""

from __future__ import annotations

from contextlib import contextmanager
from itertools import combinations

from matplotlib.figure import Figure
from matplotlib.text import Text
from matplotlib.transforms import Bbox

TOLERANCE_PX = 0.5  # anti-aliasing can spill half a pixel; more than that is a visible fault


@contextmanager
def _recording_drawn_texts(found: list[Text]):
    """Record each Text that draws itself: tick labels of ticks outside the view, empty offset
    texts and hidden artists never reach the renderer, so they are not the reader's problem."""
    original = Text.draw

    def draw(self, renderer):
        if self.get_visible() and self.get_text().strip():
            found.append(self)
        return original(self, renderer)

    Text.draw = draw
    try:
        yield
    finally:
        Text.draw = original


def drawn_texts(fig: Figure) -> list[tuple[str, Bbox]]:
    """(string, window extent in pixels) of every text the figure draws on an Agg canvas."""
    found: list[Text] = []
    with _recording_drawn_texts(found):
        fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    return [(t.get_text(), t.get_window_extent(renderer)) for t in found]


def layout_faults(fig: Figure) -> list[str]:
    """Each text that leaves the figure and each pair of texts that overlap, in words."""
    texts = drawn_texts(fig)
    page = fig.bbox
    faults = [f"{s!r} leaves the figure: {box.bounds} outside {page.bounds}"
              for s, box in texts
              if box.x0 < page.x0 - TOLERANCE_PX or box.y0 < page.y0 - TOLERANCE_PX
              or box.x1 > page.x1 + TOLERANCE_PX or box.y1 > page.y1 + TOLERANCE_PX]
    faults += [f"{a!r} overlaps {b!r}" for (a, box_a), (b, box_b) in combinations(texts, 2)
               if _overlap(box_a, box_b)]
    return faults


def _overlap(a: Bbox, b: Bbox) -> bool:
    return (min(a.x1, b.x1) - max(a.x0, b.x0) > TOLERANCE_PX
            and min(a.y1, b.y1) - max(a.y0, b.y0) > TOLERANCE_PX)
