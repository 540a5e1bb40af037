"""A run's step_pattern cannot cost more than linear time: the parse of a hostile window stays fast."""

from __future__ import annotations

import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from bot.probe.checkup import verdict_from_output
from bot.core.sections import marker
from bot.probe.runners import RunResult
from config.registry import parse_registry

# Patterns a backtracking engine takes exponential time over on "aaaa…b" lines.
REPO = Path(__file__).resolve().parents[1]
EVIL = ["(a+)+$", "(a|a)+$", "(a|aa)+$", "([a-z]+)*=", "(a*)*b$"]


@dataclass
class Run:
    step_pattern: str
    name: str = "x"
    log: str = "/x.log"
    gpu_samples: int = 1
    silence_after: float | None = 600.0
    loading_grace: float = 2700.0
    slow_below: float = 0.6
    slow_for: float = 600.0
    loss_spike: bool = False

    @property
    def roles(self):
        return {}


def probe_output(window: bytes, nonce: str = "abcdef0123456789") -> bytes:
    size = len(window)
    parts = [
        ("meta", f"now=1000.0\nhost=h\nsize={size} mtime=990 inode=1\n".encode()),
        ("window", window), ("window.rc", b"0"),
        ("steps", b"cap=1048576\n" + window), ("steps.rc", b"0"),
        ("writers", b"# hidden 0\n"), ("writers.rc", b"0"),
        ("gpus", b"@missing\n"), ("end", b""),
    ]
    return b"".join(marker(nonce) + name.encode() + b"\n" + body for name, body in parts)


def parse_hostile_window(pattern: str) -> float:
    """Load the pattern through the config and diagnose 32 lines of 1,999 "a" and a "b" (Python's
    backtracking re needs minutes for the first line alone). Returns the seconds it took."""
    text = f'[runs.x]\nhost = "local"\nlog = "/x.log"\nstep_pattern = \'{pattern}\'\n'
    run = parse_registry(text, Path("runs.toml")).runs["x"]
    window = (b"a" * 1999 + b"b\n") * 32
    started = time.perf_counter()
    verdict = verdict_from_output(run, RunResult(probe_output(window), exit_status=0), "abcdef0123456789")
    assert verdict.run == "x"
    return time.perf_counter() - started


@pytest.mark.parametrize("pattern", EVIL)
def test_the_config_accepts_the_pattern_and_it_stays_linear(pattern):
    # In a child process: a backtracking match holds the GIL, so only a kill can stop it, and a
    # regression must fail this test rather than hang the suite.
    code = f"from tests.test_step_pattern_cost import parse_hostile_window as p; print(p({pattern!r}))"
    try:
        done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=20)
    except subprocess.TimeoutExpired:
        pytest.fail(f"{pattern!r} ran for more than 20 s on a 64 KiB window")
    assert done.returncode == 0, done.stderr
    assert float(done.stdout) < 1.0


def test_the_pattern_still_finds_the_runs_own_lines():
    run = Run(step_pattern=r"progress [0-9]+/[0-9]+")
    window = b"loading\nprogress 10/100 done\n"
    verdict = verdict_from_output(run, RunResult(probe_output(window), exit_status=0), "abcdef0123456789")
    assert verdict.step is not None and "progress 10/100" in verdict.step.line
