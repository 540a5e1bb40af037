"""Pure: does the learning-rate schedule say the run was at its planned end? A loop that logs only its
lr and a counter (DeiT's per-epoch JSON, HF's dicts) says where it means to stop by where its lr runs out."""

from __future__ import annotations

from collections.abc import Sequence

from bot.core.facts import Step

# The end the lr points at may lie this share of the run's span past the last line and still be its end
# (a cosine's last decrements are tiny: extrapolating them is coarse).
_NEAR = 0.02
_MIN_POINTS = 4


def _points(steps: Sequence[Step]) -> list[tuple[float, float]]:
    out = []
    for s in steps:
        x = s.step if s.step is not None else s.epoch
        if x is not None and s.lr is not None:
            out.append((float(x), s.lr))
    return out


def at_schedule_end(steps: Sequence[Step]) -> bool:
    """The lr fell steadily and ran out at the last line: to zero (a linear or cosine-to-zero decay), or to
    a floor its shrinking decrements reach within _NEAR of the span (a cosine to `min_lr`)."""
    pts = _points(steps)
    if len(pts) < _MIN_POINTS or any(b[0] <= a[0] for a, b in zip(pts, pts[1:])):
        return False
    lrs = [lr for _, lr in pts]
    if any(b > a for a, b in zip(lrs, lrs[1:])) or lrs[0] <= lrs[-1]:
        return False  # still warming up, constant, or cyclic: it says nothing about an end
    x_last = pts[-1][0]
    span = max(x_last, 1.0)
    if lrs[-1] == 0.0:
        return True
    # Decrements per unit of the counter, and where they (a cosine's tail) or the lr itself (linear) reach zero.
    slopes = [(a[1] - b[1]) / (b[0] - a[0]) for a, b in zip(pts, pts[1:])]
    mids = [(a[0] + b[0]) / 2 for a, b in zip(pts, pts[1:])]
    if slopes[-1] <= 0:
        return False
    linear_end = x_last + lrs[-1] / slopes[-1]
    shrink = (slopes[-2] - slopes[-1]) / (mids[-1] - mids[-2])
    shrinking = all(b < a for a, b in zip(slopes, slopes[1:]))
    cosine_end = mids[-1] + slopes[-1] / shrink if shrinking and shrink > 0 else None
    end = min(e for e in (linear_end, cosine_end) if e is not None)
    return end - x_last <= _NEAR * span
