"""The debugger's Netron opt-in (docs/netron.md): the current quantized model opened in Netron, served from
127.0.0.1, never the primary graph view."""

from __future__ import annotations

from typing import Any

import ipywidgets as w

from .app_base import AppBase

__all__ = ["NetronOptIn"]


class NetronOptIn(AppBase):
    """Open or close the current model in Netron (a room of :class:`~widgets.app.DebuggerApp`)."""

    def _make_netron_widgets(self) -> None:
        """The opt-in button and where Netron's page goes."""
        self.netron: Any = None
        self.netron_button = w.Button(
            description="Open in Netron (opt-in)", icon="external-link", layout=w.Layout(width="auto")
        )
        self.netron_button.add_class("qd-netron")
        self.netron_button.on_click(self.on_netron_clicked)
        self.netron_view = w.HTML("")

    def on_netron_clicked(self, b: Any = None) -> None:
        """Open (or close) the current quantized model in Netron, served from 127.0.0.1 (docs/netron.md)."""
        if self.netron is not None:
            try:
                self.netron.stop()
            finally:
                self.netron = None
                self.netron_view.value = ""
                self.netron_button.description = "Open in Netron (opt-in)"
            self.status = "Netron stopped"
            return
        try:
            from . import netron_view

            info = netron_view.netron_build_info()
            if netron_view.netron_expired():
                # Its page would loop on "Please update to the newest version": say so instead of opening it.
                self.status = (
                    f"Netron {info.version} refuses to run since {info.expires:%Y-%m-%d} (180 days after its "
                    "build): upgrade it with pip install -U netron"
                )
                return
            self.netron = netron_view.open_in_netron(self.debugger.quant_model_path)
            frame = netron_view.netron_iframe_html(self.netron.url)
        except Exception as exc:
            self.status = f"Netron unavailable: {type(exc).__name__}: {exc}"
            return
        self.netron_view.value = (
            "<p><i>Netron is a third-party viewer: offline it needs a consent cookie, after consent it contacts "
            "Google Analytics, and its releases stop working 180 days after their build (docs/netron.md). "
            f"It only shows the graph; the colours by error are in the view above.</i></p>{frame}"
        )
        self.netron_button.description = "Stop Netron"
        left = info.days_left()
        self.status = f"Netron serving a copy of the model at {self.netron.url}" + (
            "" if left is None else f" (netron {info.version} stops working in {left:.0f} days)"
        )
