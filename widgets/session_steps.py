"""What :class:`~widgets.session.QuantDebugger` records per applied step beside the engine's results: the step's
predicted and measured gain (:class:`StepGain`), and the compiled files of a step as one download (:func:`zip_folder`).
"""

from __future__ import annotations

import io
import re
import zipfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from qdebug.io import atomic_write_bytes
from qdebug.render.fmt import fmt_db_delta

if TYPE_CHECKING:
    from qdebug.mixed.patch import PatchResult
    from qdebug.mixed.patch_remedies import RemedyPatch
    from qdebug.mixed.promote import PromotionPlan
    from qdebug.mixed.suggest import Suggestion


@dataclass(frozen=True)
class StepGain:
    """One applied step: the tensors it added, the worst output before and after it (dB) and what the calibrated
    estimate predicted for them (:func:`qdebug.mixed.diagnosis.predicted_promotion_gain`)."""

    tensors: tuple[str, ...]
    before_db: float | None
    after_db: float | None
    predicted_db: float | None

    @property
    def measured_db(self) -> float | None:
        """The worst output's change, measured (``None`` when either side is undefined)."""
        if self.before_db is None or self.after_db is None:
            return None
        return self.after_db - self.before_db

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict."""
        return {"tensors": list(self.tensors), "before_db": self.before_db, "after_db": self.after_db,
                "predicted_db": self.predicted_db}  # fmt: skip

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> StepGain:
        """Inverse of :meth:`to_dict`."""
        p = d["predicted_db"]
        return cls(tuple(d["tensors"]), d["before_db"], d["after_db"], None if p is None else float(p))

    def text(self) -> str:
        """ "predicted +0.5 dB, measured +1.4 dB" (what the estimate said beside what the promotion did)."""
        m = self.measured_db
        said = "measured " + fmt_db_delta(m)
        return said if self.predicted_db is None else f"predicted {fmt_db_delta(self.predicted_db)}, {said}"


@dataclass(frozen=True)
class Step:
    """How one applied step was made, beside its :class:`~qdebug.mixed.evaluation.Evaluation`: a promotion (its
    ``plan``, and ``patch``: what it re-gridded in your model), a fix's model (``fix_recipe``: the fix's recipe JSON)
    or a diagnostic's remedy (``remedy``: what it patched); ``per_channel`` and ``float_nodes`` are every weight and
    node the remedies so far made per-channel or float (the recipe carries them), ``patch`` the promotions under
    them."""

    gain: StepGain
    plan: PromotionPlan | None = None
    patch: PatchResult | None = None
    fix_recipe: str | None = None
    remedy: RemedyPatch | None = None
    per_channel: tuple[str, ...] = ()
    float_nodes: tuple[str, ...] = ()


def step_label(name: str) -> str:
    """A step's variant name as prose: ``"step1"`` is ``"step 1"`` (the name stays space-free for files)."""
    m = re.fullmatch(r"step(\d+)", name)
    return name if m is None else f"step {m.group(1)}"


def suggestion_line(s: Suggestion, done: StepGain | None) -> str:
    """A suggestion's line: its calibrated estimate and, once a step promoted it (``done``), what that measured."""
    text = f"{s.tensor_name} ({s.producer_op}, {s.role}): est. {fmt_db_delta(s.estimated_output_gain_db)} at output"
    if done is not None:
        others = f" with {len(done.tensors) - 1} other(s)" if len(done.tensors) > 1 else ""
        m = done.measured_db
        said = "" if done.predicted_db is None else f" (predicted {fmt_db_delta(done.predicted_db)})"
        text += f"; measured {fmt_db_delta(m)}{others}{said}"
    return text


def zip_folder(folder: Path, dest: Path) -> Path | None:
    """Every file under ``folder`` in one zip at ``dest`` (written atomically); ``None`` when there is no file."""
    if not folder.is_dir() or not any(p.is_file() for p in folder.rglob("*")):
        return None
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as z:
        for p in sorted(folder.rglob("*")):
            if p.is_file():
                z.write(p, p.relative_to(folder).as_posix())
    return atomic_write_bytes(dest, buf.getvalue())


__all__ = ["Step", "StepGain", "step_label", "suggestion_line", "zip_folder"]
