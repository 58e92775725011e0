"""``WindowResize``: a zero-size widget that makes the browser fire a window ``resize`` event when a tab opens or a
heatmap is added to the page.

Why: plotly's ``FigureWidget`` sizes itself to its container when drawn and again on a window resize. A figure
drawn inside a tab that is not shown has no width, so plotly falls back to 700 px, and opening the tab later does
not tell it (the lumino "after-show" message no longer reaches the anywidget-based FigureWidget); a figure
replaced into a shown tab can be drawn before its container is laid out, with the same result. The debugger
calls :meth:`WindowResize.fire` when a tab is opened, and the front end fires by itself when a heatmap is added;
every figure without a fixed width then fills its container.
"""

from __future__ import annotations

import anywidget
import traitlets as tr

_ESM = """
export default {
  render({ model, el }) {
    el.style.display = "none";
    let timer = null;
    // one event, shortly after the last change: plotly draws a new figure asynchronously after its element is
    // attached, and a resize before that would find nothing to resize
    const fire = () => {
      clearTimeout(timer);
      timer = setTimeout(() => window.dispatchEvent(new Event("resize")), 250);
    };
    model.on("change:tick", fire);
    // A heatmap replaced into the shown tab (grouping toggled, a promotion) is drawn at plotly's default 700 px when
    // its container was not laid out yet: the same resize gives it the container's width. Heatmaps only: a resize
    // re-lays out every figure, and one under the pointer (the graph, clicked node by node) loses its hover.
    const HEAT = ".qd-heatmap, .qd-samples-heatmap";
    const obs = new MutationObserver((muts) => {
      for (const m of muts)
        for (const n of m.addedNodes)
          if (n.nodeType === 1 && (n.matches(HEAT) || n.querySelector(HEAT))) return fire();
    });
    obs.observe(document.body, { childList: true, subtree: true });
    return () => { obs.disconnect(); clearTimeout(timer); };
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
