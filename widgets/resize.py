"""``WindowResize``: a zero-size widget that makes the browser fire a window ``resize`` event on request.

Why: plotly's ``FigureWidget`` sizes itself to its container when drawn and again on a window resize. A figure
drawn inside a tab that is not shown has no width, so plotly falls back to 700 px, and opening the tab later does
not tell it (the lumino "after-show" message no longer reaches the anywidget-based FigureWidget). The debugger
calls :meth:`WindowResize.fire` when a tab is opened; every figure without a fixed width then fills its container.
"""

from __future__ import annotations

import anywidget
import traitlets as tr

_ESM = """
export default {
  render({ model, el }) {
    el.style.display = "none";
    // after the tab's content is laid out, so the figures measure their new container
    const fire = () => requestAnimationFrame(() => window.dispatchEvent(new Event("resize")));
    model.on("change:tick", fire);
  },
};
"""


class WindowResize(anywidget.AnyWidget):
    """Invisible; :meth:`fire` makes the page dispatch one window ``resize`` event."""

    _esm = _ESM
    tick = tr.Int(0).tag(sync=True)

    def fire(self, *_: object) -> None:
        """Ask the browser for one window ``resize`` event (e.g. from a ``Tab.selected_index`` observer)."""
        self.tick += 1


__all__ = ["WindowResize"]
