"""Probe one run end to end: script -> Runner -> sections -> evidence -> verdict (shell)."""

from __future__ import annotations

import json
import re
import secrets
import time
from pathlib import Path
from typing import Protocol

from bot.diagnose import RunPolicy, diagnose, unreachable
from bot.evidence import read_evidence
from bot.probe import ProbeTarget, build_script, split_sections
from bot.runners import RunResult, Runner
from bot.verdict import Verdict

DEFAULT_TIMEOUT_S = 30.0


class CheckableRun(RunPolicy, ProbeTarget, Protocol):
    """A configured run: what both the probe and the diagnosis need."""


def verdict_from_output(run: CheckableRun, result: RunResult, nonce: str, previous: Verdict | None = None) -> Verdict:
    """Turn a finished probe into a verdict (pure; tests replay captured probe output through it)."""
    if result.failure:
        return unreachable(run, result.failure, result.failure_kind)
    sections = split_sections(result.stdout, nonce)
    if "meta" not in sections.parts:
        err = result.stderr.decode("utf-8", "replace").strip().splitlines()
        why = err[-1] if err else f"exit status {result.exit_status}"
        return unreachable(run, f"the probe did not run: {why[:200]}", "probe")
    custom = re.compile(run.step_pattern) if run.step_pattern else None
    evidence = read_evidence(sections, run.log, custom)
    return diagnose(evidence, run, previous=previous)


async def check(
    run: CheckableRun,
    runner: Runner,
    *,
    timeout: float = DEFAULT_TIMEOUT_S,
    previous: Verdict | None = None,
    save_probe: Path | None = None,
) -> Verdict:
    """Probe `run` once through `runner` and diagnose what came back."""
    nonce = secrets.token_hex(8)
    script = build_script(run, nonce)
    result = await runner.run(script, timeout=timeout)
    if save_probe is not None:
        save_capture(save_probe, run.name, nonce, result)
    return verdict_from_output(run, result, nonce, previous)


def save_capture(folder: Path, run_name: str, nonce: str, result: RunResult) -> Path:
    """Keep a probe's raw output (for replays in tests): <run>-<ms>.probe plus a .json beside it."""
    folder.mkdir(parents=True, exist_ok=True)
    stem = folder / f"{run_name}-{int(time.time() * 1000)}"
    stem.with_suffix(".probe").write_bytes(result.stdout)
    meta = {
        "run": run_name,
        "nonce": nonce,
        "exit_status": result.exit_status,
        "failure": result.failure,
        "failure_kind": result.failure_kind,
        "elapsed_s": round(result.elapsed_s, 4),
        "stderr": result.stderr.decode("utf-8", "replace")[-4000:],
        "saved_at": time.time(),
    }
    stem.with_suffix(".json").write_text(json.dumps(meta, indent=1))
    return stem
