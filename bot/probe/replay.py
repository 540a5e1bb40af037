"""Saved probes (`--save-probe DIR`) read back: each re-diagnosed by today's runbot, in order, optionally
later on the remote clock — how a user's bug report, or a real capture, becomes a verdict again."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from bot.core.verdict import Verdict
from bot.probe.checkup import CheckableRun, verdict_from_output
from bot.probe.runners import RunResult
from config.registry import DEFAULT_LOADING_GRACE, DEFAULT_SILENCE_AFTER


class CaptureError(Exception):
    """A file that is not a saved probe, said in one line."""


@dataclass(frozen=True)
class Capture:
    path: Path  # the .probe file
    run: str
    nonce: str
    result: RunResult
    saved_at: float = 0.0


@dataclass
class DefaultRun:
    """A run with runbot's defaults wherever it says nothing: a capture from someone else's cluster, a
    real log read the way a user who set nothing reads it."""

    name: str
    log: str = "(replayed)"
    step_pattern: str | None = None
    gpu_samples: int = 1
    silence_after: float | None = DEFAULT_SILENCE_AFTER
    loading_grace: float = DEFAULT_LOADING_GRACE
    slow_below: float = 0.6
    slow_for: float = 600.0
    loss_spike: bool = False
    gpus: dict = field(default_factory=dict)

    @property
    def roles(self) -> Mapping[str, Sequence[int]]:
        return self.gpus


def load(path: Path) -> Capture:
    """A saved probe from its .probe or its .json (the other one beside it)."""
    probe, meta_file = path.with_suffix(".probe"), path.with_suffix(".json")
    try:
        meta = json.loads(meta_file.read_text())
        stdout = probe.read_bytes()
    except FileNotFoundError as exc:
        raise CaptureError(f"{path}: a saved probe is a .probe with its .json beside it ({exc.filename} is missing)") from None
    except (OSError, ValueError) as exc:
        raise CaptureError(f"{path}: not a saved probe ({exc})") from None
    if not isinstance(meta, dict) or not isinstance(meta.get("nonce"), str) or not isinstance(meta.get("run"), str):
        raise CaptureError(f"{meta_file}: not a saved probe's metadata (no run or nonce)")
    result = RunResult(stdout=stdout, stderr=str(meta.get("stderr") or "").encode(), exit_status=meta.get("exit_status"),
                       failure=meta.get("failure"), failure_kind=meta.get("failure_kind"),
                       elapsed_s=float(meta.get("elapsed_s") or 0.0))
    return Capture(probe, meta["run"], meta["nonce"], result, float(meta.get("saved_at") or 0.0))


def replay(captures: Sequence[Capture], runs: Mapping[str, CheckableRun], *, later: float = 0.0) -> list[tuple[Capture, Verdict]]:
    """Each capture's verdict, oldest first; a run's earlier capture is its `previous`, as in the watchdog's
    sweeps. `later` moves every capture's clock on (the last one's is what "if nothing changed" asks)."""
    previous: dict[str, Verdict] = {}
    out = []
    for c in sorted(captures, key=lambda c: (c.saved_at, str(c.path))):
        run = runs.get(c.run) or DefaultRun(c.run)
        verdict = verdict_from_output(run, c.result, c.nonce, previous.get(c.run), later=later)
        previous[c.run] = verdict
        out.append((c, verdict))
    return out
