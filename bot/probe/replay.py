"""Saved probes (`--save-probe DIR`) read back: each re-diagnosed by today's runbot, in order, optionally
later on the remote clock — how a user's bug report, or a real capture, becomes a verdict again."""

from __future__ import annotations

import json
import math
import os
import stat
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from bot.core.redact import printable
from bot.core.verdict import Verdict
from bot.probe.checkup import CheckableRun, verdict_from_output
from bot.probe.runners import RunResult
from config.registry import DEFAULT_LOADING_GRACE, DEFAULT_SILENCE_AFTER


# A probe's answer is tens of KiB (a 64 KiB log window and the rest), a group's a few MiB; its
# metadata a few hundred bytes. Anything larger is not a saved probe, and is not read to find out.
MAX_PROBE_BYTES = 32 << 20
MAX_META_BYTES = 1 << 20


class CaptureError(Exception):
    """A file that is not a saved probe, said in one printable line."""

    def __init__(self, message: str) -> None:
        super().__init__(" ".join(printable(message).split()))


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
        text = _read(meta_file, MAX_META_BYTES).decode()
        meta = json.loads(text)
        stdout = _read(probe, MAX_PROBE_BYTES)
    except FileNotFoundError as exc:
        raise CaptureError(f"{path}: a saved probe is a .probe with its .json beside it ({exc.filename} is missing)") from None
    except RecursionError:  # `[[[[…]]]]` nested deeper than the parser goes
        raise CaptureError(f"{meta_file}: not a saved probe's metadata (nested too deep)") from None
    except (OSError, ValueError) as exc:
        raise CaptureError(f"{path}: not a saved probe ({getattr(exc, 'strerror', None) or exc})") from None
    if not isinstance(meta, dict) or not isinstance(meta.get("nonce"), str) or not isinstance(meta.get("run"), str):
        raise CaptureError(f"{meta_file}: not a saved probe's metadata (no run or nonce)")
    number = (int, float)
    got = {name: _typed(meta_file, meta, name, types) for name, types in (
        ("stderr", str), ("exit_status", int), ("failure", str), ("failure_kind", str), ("elapsed_s", number),
        ("saved_at", number))}
    result = RunResult(stdout=stdout, stderr=(got["stderr"] or "").encode(errors="replace"), exit_status=got["exit_status"],
                       failure=got["failure"], failure_kind=got["failure_kind"], elapsed_s=float(got["elapsed_s"] or 0.0))
    return Capture(probe, meta["run"], meta["nonce"], result, float(got["saved_at"] or 0.0))


def _read(path: Path, cap: int) -> bytes:
    """A regular file's bytes, at most `cap`. Opened without blocking (a FIFO would wait for a writer) and
    looked at before it is read: a device (a link to /dev/zero), a FIFO or a folder is refused unread."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise CaptureError(f"{path}: not a saved probe (not a regular file)")
        if info.st_size > cap:
            raise CaptureError(f"{path}: not a saved probe ({info.st_size} bytes, over {cap >> 20 or 1} MiB)")
        chunks, size = [], 0
        while size <= cap and (chunk := os.read(fd, min(1 << 20, cap + 1 - size))):
            chunks.append(chunk)
            size += len(chunk)
        if size > cap:  # it grew while being read
            raise CaptureError(f"{path}: not a saved probe (over {cap >> 20 or 1} MiB)")
        return b"".join(chunks)
    finally:
        os.close(fd)


def _typed(meta_file: Path, meta: dict, name: str, types: type | tuple[type, ...]):
    """A metadata field of the type a saved probe writes, or None when absent; anything else is refused."""
    value = meta.get(name)
    ok = value is None or (isinstance(value, types) and not isinstance(value, bool)
                           and not (isinstance(value, float) and not math.isfinite(value)))
    if not ok:
        raise CaptureError(f"{meta_file}: not a saved probe's metadata ({name} is {type(value).__name__} {value!r:.40})")
    return value


def replay(captures: Sequence[Capture], runs: Mapping[str, CheckableRun], *, later: float = 0.0) -> list[tuple[Capture, Verdict]]:
    """Each capture's verdict, oldest first; a run's earlier capture is its `previous`, as in the watchdog's
    sweeps. `later` moves every capture's clock on (the last one's is what "if nothing changed" asks)."""
    previous: dict[str, Verdict] = {}
    out = []
    for c in sorted(captures, key=lambda c: (c.saved_at, str(c.path))):
        run = runs.get(c.run) or DefaultRun(c.run)
        before = previous.get(c.run)
        # What the earlier captures taught of the run's format carries to the next, as in the bot's memory.
        verdict = verdict_from_output(run, c.result, c.nonce, before, later=later,
                                      learned=before.learned if before is not None else None)
        previous[c.run] = verdict
        out.append((c, verdict))
    return out
