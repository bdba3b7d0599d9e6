"""How far a forward pass's results are from the reference's, for the executors' tests."""

from __future__ import annotations

import numpy as np

from cellfuse.graph_model import Forward


def relative_error(got: Forward, ref: Forward, floor: float = 0.0) -> float:
    """max |got - ref| / max |ref| over the output sequence and the final states; the scale is at
    least `floor`, for outputs that are all nearly zero."""
    assert set(got.final) == set(ref.final)
    pairs = [(got.y, ref.y)] + [(got.final[s], ref.final[s]) for s in ref.final]
    for g, r in pairs:
        assert g.shape == r.shape
    err = max(float(np.abs(g.astype(np.float64) - r).max()) for g, r in pairs)
    scale = max(max(float(np.abs(r).max()) for _, r in pairs), floor)
    return err / scale if scale > 0 else err
