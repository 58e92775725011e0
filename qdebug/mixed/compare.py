"""Before/after comparison of two debug reports of the same float model."""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

from qdebug.report import DebugReport, decode_number, encode_number

if TYPE_CHECKING:
    import pandas as pd

SCHEMA_VERSION = 1


def _delta(a: float | None, b: float | None) -> float | None:
    if a is None or b is None or math.isinf(a) or math.isinf(b):
        return None
    return b - a


@dataclass(frozen=True)
class SqnrDelta:
    """One tensor's or output's SQNR before and after, and the change (None when not comparable)."""

    name: str
    before_db: float | None
    after_db: float | None
    delta_db: float | None
    before_type: str | None = None
    after_type: str | None = None


@dataclass(frozen=True)
class Accuracy:
    """Top-1 accuracy of the float, the base (e.g. 8-bit) and the changed (mixed) model."""

    float_model: float
    base: float
    changed: float
    num_samples: int

    @property
    def drop_changed(self) -> float:
        """Accuracy lost by the changed model (fraction)."""
        return self.float_model - self.changed


@dataclass(frozen=True)
class Comparison:
    """Per-output, per-tensor (cumulative and local) SQNR deltas, and accuracy where labels exist."""

    outputs: tuple[SqnrDelta, ...]
    cumulative: tuple[SqnrDelta, ...]
    local: tuple[SqnrDelta, ...]
    accuracy: Accuracy | None = None

    @property
    def min_output_delta_db(self) -> float | None:
        """Change of the worst model output's SQNR."""
        vals = [d.delta_db for d in self.outputs]
        return None if not vals or any(v is None for v in vals) else min(v for v in vals if v is not None)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict with ``schema_version``."""

        def enc(d: SqnrDelta) -> dict[str, Any]:
            return {k: encode_number(v) if isinstance(v, float) else v for k, v in asdict(d).items()}

        return {
            "schema_version": SCHEMA_VERSION,
            "outputs": [enc(d) for d in self.outputs],
            "cumulative": [enc(d) for d in self.cumulative],
            "local": [enc(d) for d in self.local],
            "accuracy": None if self.accuracy is None else asdict(self.accuracy),
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Comparison:
        """Inverse of :meth:`to_dict`."""

        def dec(x: dict[str, Any]) -> SqnrDelta:
            return SqnrDelta(
                name=x["name"],
                before_db=decode_number(x["before_db"]),
                after_db=decode_number(x["after_db"]),
                delta_db=decode_number(x["delta_db"]),
                before_type=x.get("before_type"),
                after_type=x.get("after_type"),
            )

        acc = d.get("accuracy")
        return cls(
            outputs=tuple(dec(x) for x in d["outputs"]),
            cumulative=tuple(dec(x) for x in d["cumulative"]),
            local=tuple(dec(x) for x in d["local"]),
            accuracy=None if acc is None else Accuracy(**acc),
        )

    def to_json(self) -> str:
        """JSON text."""
        return json.dumps(self.to_dict(), indent=2, allow_nan=False)

    def to_dataframe(self) -> pd.DataFrame:
        """One row per activation: cumulative and local before/after/delta and the types."""
        import pandas as pd

        local = {d.name: d for d in self.local}
        rows = []
        for c in self.cumulative:
            lo = local.get(c.name)
            rows.append(
                {
                    "tensor_name": c.name,
                    "type_before": c.before_type,
                    "type_after": c.after_type,
                    "cumulative_before_db": c.before_db,
                    "cumulative_after_db": c.after_db,
                    "cumulative_delta_db": c.delta_db,
                    "local_before_db": lo.before_db if lo else None,
                    "local_after_db": lo.after_db if lo else None,
                    "local_delta_db": lo.delta_db if lo else None,
                }
            )
        return pd.DataFrame(rows)


def compare(before: DebugReport, after: DebugReport, accuracy: Accuracy | None = None) -> Comparison:
    """Deltas after − before for every output and every activation present in both reports."""
    outs_after = {o.output_name: o for o in after.model_outputs}
    outputs = tuple(
        SqnrDelta(
            o.output_name,
            o.cumulative_sqnr_db,
            outs_after[o.output_name].cumulative_sqnr_db,
            _delta(o.cumulative_sqnr_db, outs_after[o.output_name].cumulative_sqnr_db),
        )
        for o in before.model_outputs
        if o.output_name in outs_after
    )
    acts_after = {a.tensor_name: a for a in after.activations}
    cumulative, local = [], []
    for a in before.activations:
        b = acts_after.get(a.tensor_name)
        if b is None:
            continue
        cumulative.append(
            SqnrDelta(
                a.tensor_name,
                a.cumulative_sqnr_db,
                b.cumulative_sqnr_db,
                _delta(a.cumulative_sqnr_db, b.cumulative_sqnr_db),
                a.quant_type,
                b.quant_type,
            )
        )
        if a.quantized or b.quantized:
            local.append(
                SqnrDelta(
                    a.tensor_name,
                    a.local_sqnr_db,
                    b.local_sqnr_db,
                    _delta(a.local_sqnr_db, b.local_sqnr_db),
                    a.quant_type,
                    b.quant_type,
                )
            )
    return Comparison(outputs=outputs, cumulative=tuple(cumulative), local=tuple(local), accuracy=accuracy)
