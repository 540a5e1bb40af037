"""Pure: what is worth saying beside the phase — a loss gone NaN, fp16 overflowing on every step, a dead thread,
an idle GPU role, a log replaced under its writer, a rank spinning in a collective — as typed findings."""

from __future__ import annotations

import math
import re
from collections.abc import Sequence

from bot.core.evidence import Evidence
from bot.core.facts import Crash, Step
from bot.core.gpus import GpuReport, format_indices
from bot.core.grammar import fields
from bot.core.verdict import Finding, Found


def nan_loss(steps: Sequence[Step]) -> Found | None:
    """The loss (or its gradient norm) is nan/inf now: since which step, and the last good value before."""
    if not steps or not steps[-1].non_finite:
        return None
    first = len(steps) - 1
    while first > 0 and steps[first - 1].non_finite:
        first -= 1
    good = next((s for s in reversed(steps[:first]) if s.loss is not None and math.isfinite(s.loss)), None)
    last = steps[-1]
    what = "loss" if any("loss" in k for k in last.non_finite) else last.non_finite[0]
    if what == "loss" and last.loss is not None and math.isinf(last.loss):
        what = "loss inf" if last.loss > 0 else "loss -inf"
    else:
        what += " NaN"
    since = steps[first].step if first > 0 or len(steps) == 1 else None  # the run of NaN may start before the kept lines
    unit = "batch" if last.counter == "batch" else "iteration" if last.counter in ("iteration", "iters") else "step"
    return Found(Finding.NAN_LOSS, what, since, good.loss if good else None, good.step if good else None, unit)


# fp16's dynamic loss scaler reports each step it skips for an overflow. One table; where each comes from:
_OVERFLOW = re.compile(
    r"(?i)Gradient overflow\.\s+Skipping step"  # apex amp, fairseq, Megatron: `… loss scaler 0 reducing loss scale to 1e-05`
    r"|OVERFLOW! Rank \d+ Skipping step"  # DeepSpeed: `[deepspeed] OVERFLOW! Rank 0 Skipping step. Attempted loss scale: 1, reducing to 1`
)
# The field that holds the scale now: the scaler's new value, or a step line's `loss scale: 1.0` / `'loss_scale': 0.0`.
_SCALE_KEY = re.compile(r"(?:loss[ _]scale|reducing(?: loss scale)? to)$")
# The scaler's floor (DeepSpeed's default min_loss_scale; apex goes on below it): overflowing there, every step
# is skipped and nothing learns. Falling from 2**32 during the first steps is the scaler's normal search.
SCALE_FLOOR = 1.0


def loss_scale(lines: Sequence[str], steps: Sequence[Step]) -> Found | None:
    """fp16 overflowing on every step: the scaler still reports overflows since the step before the last and
    its scale is down at its floor (or at 0, which never trains) — the counter ticks, no step is taken."""
    since = steps[-2].index if len(steps) > 1 and steps[-2].index >= 0 else 0
    scale, overflowing = None, False
    for i in range(max(0, len(lines) - 200), len(lines)):
        text = lines[i]
        if "scale" not in text.lower():
            continue
        if _OVERFLOW.search(text):
            overflowing = overflowing or i >= since
        found = [f.value for f in fields(text) if _SCALE_KEY.search(f.key)]
        scale = found[-1] if found else scale
    if scale is None or not (scale == 0 or (overflowing and scale <= SCALE_FLOOR)):
        falling = _falling_scale(steps)
        if falling is None:
            return None
        scale = falling
    last = steps[-1] if steps else None
    return Found(Finding.LOSS_SCALE, "fp16", last.step if last else None, value=scale)


# A step line's own scale field (`it 40 | loss 9.87 | scale 5.96e-08`): its name alone may be anything's scale.
_STEP_SCALE_KEY = re.compile(r"(?:^|[ _/])(?:(?:loss|grad)[ _])?scale$")
FALLING_LINES = 5  # step lines in a row with the scale at most half the one before: the scaler skipped each step


def _falling_scale(steps: Sequence[Step]) -> float | None:
    """A scaler that prints no overflow but whose scale the step lines show halving line after line, down past its
    floor (a plain loop printing GradScaler.get_scale()): every step overflowed and was skipped. The scale now."""
    if len(steps) < FALLING_LINES or "scale" not in steps[-1].line.lower():
        return None  # most loops print no scale: their step lines are not tokenised again
    values = []
    for s in steps[-FALLING_LINES:]:
        found = [f.value for f in fields(s.line) if _STEP_SCALE_KEY.search(f.key) and f.finite]
        if not found:
            return None
        values.append(found[-1])
    if len(values) < FALLING_LINES or values[-1] > SCALE_FLOOR:
        return None
    return values[-1] if all(0 <= b <= a / 2 for a, b in zip(values, values[1:])) else None


def thread_died(crash: Crash | None) -> Found | None:
    return Found(Finding.THREAD_DIED, crash.thread or "?") if crash is not None else None


def idle_roles(gpu: GpuReport) -> list[Found]:
    """An idle role is a finding only beside a role that works ("idle drafters while the target steps");
    every GPU idle with a fresh log is a pause between steps, or silence on its way."""
    roles = [role for role, idx in gpu.roles if idx and gpu.in_role(role)]
    idle = [role for role in roles if all(g.cls == "idle" for g in gpu.in_role(role))]
    if len(idle) == len(roles):
        return []
    return [Found(Finding.IDLE_ROLE, role) for role in idle]


def stuck_collective(gpu: GpuReport) -> Found | None:
    """Busy in every sample while the log is silent: a rank spinning in a collective, waiting for a peer
    whose GPU sits idle (or whose process is gone). Names both sides."""
    spinning = [g for g in gpu.gpus if g.cls == "busy" and (floor := g.floor) is not None and floor >= 90]
    if not spinning:
        return None
    idle = [g for g in gpu.gpus if g.cls == "idle"]
    text = f"{gpu_names(spinning)} at 100 % with no new steps (stuck in a collective?)"
    return Found(Finding.STUCK_COLLECTIVE, text + (f", waiting on idle {gpu_names(idle)}" if idle else ""))


def gpu_names(states) -> str:
    """"target GPU 0", "drafter GPUs 5–7", or "GPU 0" when no role is configured."""
    roles = {g.role for g in states}
    role = f"{roles.pop()} " if len(roles) == 1 and None not in roles else ""
    return f"{role}GPU{'s' if len(states) > 1 else ''} {format_indices(g.index for g in states)}"


def replaced(ev: Evidence) -> Found | None:
    if ev.moved is None:
        return None
    name = ev.moved.path.rsplit("/", 1)[-1]
    return Found(Finding.LOG_REPLACED, name, ev.moved.steps[-1].step if ev.moved.steps else None)
