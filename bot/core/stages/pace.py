"""Pure: how long this run's evaluations and saves took before — the silence a repeat of one may keep
before it reads as a hang, learned from the log rather than one grace for every phase."""

from __future__ import annotations

import re
from collections.abc import Sequence

from bot.core.evidence import Evidence
from bot.core.markers import Mark
from bot.core.stages.activity import Doing
from bot.core.verdict import Phase

# Several times the longest earlier one, never under the floor: a final evaluation may run a larger set.
PACE_FACTOR, PACE_FLOOR_S = 10.0, 300.0
STILL_FACTOR = 3.0  # an announced phase with nothing that moves: "a log that has not changed for 30 min is a hang"
_KINDS = {Phase.EVALUATING: Mark.EVALUATING, Phase.SAVING: Mark.SAVING}
# HF Trainer's metrics: `'eval_runtime': 11.2` (seconds the evaluation took).
_RUNTIME = {Phase.EVALUATING: re.compile(r"""['"]?eval_runtime['"]?\s*[:=]\s*([\d.]+)""")}


def _took(ev: Evidence, start: int, kind: Mark) -> float | None:
    """From an announcement's stamp to the stamp of the first later event of another kind: a marker
    (its closing, a save, the next step's line) — only where both lines carry the logger's stamp."""
    began = _stamp(ev, start)
    if began is None:
        return None
    ends = [m.index for m in ev.markers if m.index > start and m.kind is not kind]
    ends += [s.index for s in ev.steps if s.index > start]
    for end in sorted(ends):
        if (stamp := _stamp(ev, end)) is not None and stamp >= began:
            return stamp - began
    return None


def _stamp(ev: Evidence, i: int) -> float | None:
    """A line's stamp, or its logger's on the line above (HF's `[INFO|…] trainer.py:4117 >> ` then a newline)."""
    for j in (i, i - 1):
        if 0 <= j < len(ev.stamps) and ev.stamps[j] is not None:
            return ev.stamps[j]
    return None


def durations(ev: Evidence, phase: Phase, before: int) -> Sequence[float]:
    """How long each earlier evaluation (or save) above line `before` took, in seconds."""
    kind = _KINDS.get(phase)
    if kind is None:
        return ()
    out = [t for m in ev.markers if m.kind is kind and m.index < before and (t := _took(ev, m.index, kind)) is not None]
    if pattern := _RUNTIME.get(phase):
        out += [float(m[1]) for x in ev.lines[:before] if (m := pattern.search(x))]
    return tuple(out)


def phase_threshold(ev: Evidence, doing: Doing, grace: float, silence_after: float) -> float:
    """The silence allowed in this phase: `grace`, or less where the run's own earlier ones were quick; an
    evaluation announced with nothing that can move (no bar) and no earlier one to go by, a few times the loop's
    own silence (OpenNMT-tf's `Starting evaluation`, then 40 minutes of nothing)."""
    here = doing.marker.index if doing.marker is not None else doing.bar.index if doing.bar is not None else None
    if here is None:
        return grace
    took = durations(ev, doing.phase, here)
    if not took:
        still = doing.phase is Phase.EVALUATING and doing.bar is None
        return min(grace, STILL_FACTOR * silence_after) if still else grace
    return min(grace, max(PACE_FLOOR_S, PACE_FACTOR * max(took)))
