"""``WindowResize``: a zero-size widget that keeps every plotly figure of the page as wide as its container.

Why: plotly's ``FigureWidget`` sizes itself to its container when drawn, and follows window resizes only through
plotly.js's ``responsive`` handler (the widget's own listener is never installed under anywidget). Two cases
leave a figure at plotly's default 700 px, a third of a wide page:

* a figure drawn inside a tab that is not shown has no width to fill, and opening the tab later does not tell it
  (the lumino "after-show" message no longer reaches the anywidget-based FigureWidget);
* a figure replaced into a shown tab (the heatmap after "group by scope", a promotion) is drawn by plotly before
  its element is laid out, and nothing resizes it afterwards — it stayed at 700 px until the next tab switch.

The front end therefore watches every figure plotly's widget draws (its ``plotlywidget-after-render`` event): a
figure whose width is not fixed and differs from its element's is resized at once, and a ``ResizeObserver`` on
its element resizes it again whenever the element's width changes (a tab opened, the window resized). Only that
figure is resized (plotly.js's own per-figure ``_responsiveChartHandler``), not every figure of the page: a
window-wide resize re-lays out the graph under the pointer too, which loses its hover. :meth:`WindowResize.fire`
(called when a tab opens) still dispatches one window ``resize`` event for anything else.
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
    // A figure whose width is plotly's choice (no layout.width), drawn, shown, and not as wide as its element.
    const misSized = (gd) => gd.isConnected && gd.layout && !gd.layout.width && gd._fullLayout
      && gd.clientWidth > 0 && Math.abs(gd._fullLayout.width - gd.clientWidth) > 2;
    const resize = (gd) => {
      if (!misSized(gd)) return;
      if (typeof gd._responsiveChartHandler === "function") gd._responsiveChartHandler();  // this figure only
      else fire();
    };
    const watch = new ResizeObserver((entries) => { for (const e of entries) resize(e.target); });
    const drawn = (ev) => {
      const gd = ev.detail && ev.detail.element;
      if (!gd) return;
      watch.observe(gd);  // observing twice is a no-op; a removed element is dropped by the observer
      resize(gd);
    };
    document.addEventListener("plotlywidget-after-render", drawn);
    return () => {
      document.removeEventListener("plotlywidget-after-render", drawn);
      watch.disconnect();
      clearTimeout(timer);
    };
  },
};
"""


class WindowResize(anywidget.AnyWidget):
    """Invisible; keeps the page's plotly figures at their container's width, and :meth:`fire` makes the page
    dispatch one window ``resize`` event."""

    _esm = _ESM
    tick = tr.Int(0).tag(sync=True)

    def fire(self, *_: object) -> None:
        """Ask the browser for one window ``resize`` event (e.g. from a ``Tab.selected_index`` observer)."""
        self.tick += 1


__all__ = ["WindowResize"]
