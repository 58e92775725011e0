"""The search tab's budget inputs: how far the automatic search may go (the 16-bit budget, evaluations, candidates
per step, candidates measured first, steps), each shown only for the strategies that read it
(:data:`qdebug.mixed.search.BUDGET_STRATEGIES`) and explained in plain words.

The inputs are text boxes so that a value the search cannot use is said in the tab, not clamped in silence: empty
means the default (no limit for the 16-bit budget). :meth:`SearchBudgets.values` turns them into the keyword
arguments of :func:`qdebug.mixed.search.user_goal`, the one place where ``qdebug search``'s options become a goal
too, so the same settings search the same in both.
"""

from __future__ import annotations

import html
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TypedDict

import ipywidgets as w

from qdebug.errors import ConfigError
from qdebug.mixed.search import BUDGET_STRATEGIES, USER_MAX_STEPS, SearchGoal
from qdebug.mixed.search_measured import DEFAULT_MAX_EVALUATIONS, DEFAULT_MEASURE_TOP

__all__ = ["Budgets", "SearchBudgets", "whole_number"]


class Budgets(TypedDict, total=False):
    """The budgets the shown inputs set: keyword arguments of :func:`~qdebug.mixed.search.user_goal`."""

    max_cost_fraction: float | None
    max_evaluations: int | None
    candidates_per_step: int | None
    measure_top: int | None
    max_steps: int | None


@dataclass(frozen=True)
class _Field:
    """One budget input: its label, what it does in plain words and what empty means."""

    label: str
    help: str
    empty: str
    #: strategy → (what it does, what empty means) where the budget means something else for that strategy
    per_strategy: Mapping[str, tuple[str, str]] = field(default_factory=dict)

    def text(self, strategy: str) -> tuple[str, str]:
        """What the input does for ``strategy``, and what empty means."""
        return self.per_strategy.get(strategy, (self.help, self.empty))


_STEPS = str(USER_MAX_STEPS)
_FIELDS: dict[str, _Field] = {
    "max_cost_fraction": _Field(
        "16-bit budget %",
        "The largest share of the model's activation data that may be kept in 16 bits, in percent (e.g. 10). "
        "16-bit data costs memory and time on the device; the search never keeps a step that goes over it.",
        "no limit",
    ),
    "max_evaluations": _Field(
        "max evaluations",
        "How many trial models the whole step-by-step search may build and measure, its first sweep included. "
        "Each takes about as long as one debug pass: fewer is faster, more may find a cheaper point. Empty: about "
        "one per candidate plus a few (N + 2·log2 N).",
        DEFAULT_MAX_EVALUATIONS,
    ),
    "candidates_per_step": _Field(
        "candidates/step",
        "How many candidates (a tensor, or a group that only helps together) are tried one by one at each step "
        "before the best one is kept. More tries choose better and take longer.",
        str(SearchGoal.candidates_per_step),
    ),
    "measure_top": _Field(
        "measure first",
        "How many trial models the first sweep may take to find where the noise is (each part of the model left "
        "in 8 bits in turn).",
        "as many as needed",
        {
            "measured": (
                "How many of the most promising candidates are tried alone, one at a time.",
                str(DEFAULT_MEASURE_TOP),
            )
        },
    ),
    "max_steps": _Field(
        "max steps",
        "At most this many trial models when combining the candidates.",
        _STEPS,
        {
            "prefix": ("At most this many trial models.", _STEPS),
            "greedy": ("At most this many tensors added to 16 bits, one step each.", _STEPS),
            "stepwise": ("At most this many candidates added to 16 bits, one step each.", _STEPS),
        },
    ),
}


class SearchBudgets:
    """The budget inputs of the search tab (``box``), shown for the strategy given to :meth:`show_for`."""

    def __init__(self, strategy: str = "prefix") -> None:
        self.inputs: dict[str, w.Text] = {
            name: w.Text(description=f.label, style={"description_width": "initial"}, layout=w.Layout(width="210px"))
            for name, f in _FIELDS.items()
        }
        for name, box in self.inputs.items():
            box.add_class(f"qd-budget-{name.replace('_', '-')}")  # a stable selector for the browser tests
        self.help = w.HTML("")
        self.help.add_class("qd-budget-help")
        self.box = w.VBox([w.HBox(list(self.inputs.values()), layout=w.Layout(flex_flow="row wrap")), self.help])
        self.strategy = strategy
        self.show_for(strategy)

    def applies(self, name: str) -> bool:
        """Whether the selected strategy reads the budget ``name``."""
        return self.strategy in BUDGET_STRATEGIES[name]

    def show_for(self, strategy: str) -> None:
        """Show the inputs ``strategy`` reads (hide the others: their values are not used), with what each does."""
        self.strategy = strategy
        lines = []
        for name, box in self.inputs.items():
            shown = self.applies(name)
            box.layout.display = None if shown else "none"
            why, empty = _FIELDS[name].text(strategy)
            box.placeholder = empty
            box.tooltip = f"{why} Empty: {empty}."
            if shown:
                lines.append(f"<li><b>{html.escape(_FIELDS[name].label)}</b>: {html.escape(why)} "
                             f"<i>Empty: {html.escape(empty)}.</i></li>")  # fmt: skip
        self.help.value = f"<ul style='margin:2px 0;color:#495057;font-size:90%'>{''.join(lines)}</ul>"

    def values(self) -> Budgets:
        """The shown budgets as :func:`~qdebug.mixed.search.user_goal` takes them (``None``: the default); a value
        it cannot use raises :class:`~qdebug.errors.ConfigError` that names the input and says what it takes. A
        hidden input is left out: whatever it holds is not the selected strategy's."""
        text = {name: box.value.strip() for name, box in self.inputs.items() if self.applies(name)}
        out = Budgets()
        if "max_cost_fraction" in text:
            out["max_cost_fraction"] = _percent(text["max_cost_fraction"])
        for name in ("max_evaluations", "candidates_per_step", "measure_top", "max_steps"):
            if name in text:
                out[name] = _count(name, text[name])
        return out


def _percent(text: str) -> float | None:
    """The 16-bit budget typed in percent ("10", "2.5 %") as a share; empty: no limit."""
    label = _FIELDS["max_cost_fraction"].label
    if not text:
        return None
    try:
        pct = float(text.removesuffix("%").strip())
    except ValueError:
        raise ConfigError(
            f"{label}: {text!r} is not a number; type a percentage like 10 (or leave it empty for no limit)"
        ) from None
    if not math.isfinite(pct) or not 0 < pct <= 100:
        raise ConfigError(f"{label}: must be more than 0 and at most 100 (percent), got {text!r}")
    return pct / 100.0


def _count(name: str, text: str) -> int | None:
    """A whole number of at least 1; empty: the default."""
    return whole_number(_FIELDS[name].label, text, like=4, empty=" for the default")


def whole_number(label: str, text: str, *, like: int, empty: str = "") -> int | None:
    """A whole number of at least 1 typed in the input ``label`` (empty: ``None``), else a
    :class:`~qdebug.errors.ConfigError` that names the input and gives an example (``like``) and what empty means."""
    text = text.strip()
    if not text:
        return None
    try:
        n = int(text)
    except ValueError:
        raise ConfigError(
            f"{label}: {text!r} is not a whole number; type one like {like} (or leave it empty{empty})"
        ) from None
    if n < 1:
        raise ConfigError(f"{label}: must be 1 or more, got {n}")
    return n
