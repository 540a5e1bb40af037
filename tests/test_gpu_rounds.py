"""Rounds 8 to 11's real jobs on an H200 (tests/fixtures/gpu-jobs3/ to gpu-jobs6/, each README
says what ran): torchrun's ranks that hang, die of SIGKILL, run out of memory, share a GPU under NCCL, or fail and are
restarted by the agent (static and c10d rendezvous); accelerate's batch-size search finding none; a loop SIGSTOPped
and continued; a segfault under faulthandler; an HF Trainer stopped early; a Lightning validation step that raises; a
loop logging JSON lines; nested tqdm bars; DataLoader workers that all block; a 40 GB save; torch.multiprocessing.spawn
with a rank that raises; autograd's anomaly mode; a preemptible loop's SIGTERM; a batch-size search whose OOMs are
caught; fp16 overflowing on every step; a SIGKILLed loop relaunched from its checkpoint onto its log; a long
evaluation that prints nothing. Each moment replayed
(tests/gpu_replay.py) and its first line judged against the expectation written before any runbot answer was read
(`<job>/expected.toml`)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from bot.core.verdict import Level, Phase
from tests.corpus import misread
from tests.gpu_replay import cases, replay_all, snapshot
from tests.gpu_replay import probe as replay

FIXTURES = Path(__file__).parent / "fixtures"
BATCHES = ("gpu-jobs3", "gpu-jobs4", "gpu-jobs5", "gpu-jobs6")
MOVED_ON_S = 15 * 60.0
CASES = [(f"{batch}/{name}", moment) for batch in BATCHES for name, moment in cases(FIXTURES / batch)]


@pytest.fixture(scope="module")
def verdicts(tmp_path_factory):
    return replay_all(FIXTURES, CASES, tmp_path_factory.mktemp)


def test_every_moment_of_the_device_runs_is_here():
    jobs = {batch: {n.split("/")[1] for n, _ in CASES if n.startswith(batch + "/")} for batch in BATCHES}
    assert len(CASES) == 51 and jobs == {
        "gpu-jobs3": {"ddp-hang", "ddp-oom", "nccl-dup", "accel-bs", "sigstop", "segv"},
        "gpu-jobs4": {"elastic", "elastic-c10d", "hf-early", "lit-val-crash", "jsonl", "nested"},
        "gpu-jobs5": {"dl-hang", "save", "spawn", "anomaly", "sigterm"},
        "gpu-jobs6": {"oom-retry", "scale", "resume", "eval-long"}}


def test_the_snapshots_hold_what_the_replays_rest_on():
    """torchrun's agent holds the log with both ranks under it; the stopped loop was in state T, the resumed one
    not; at the restart the agent's two new workers started after the failure."""
    [agent] = snapshot(FIXTURES / "gpu-jobs3" / "ddp-hang" / "hung").roots
    assert "torch.distributed.run" in agent.command and len(agent.children) == 2
    assert all(any(mode == "w" for _, mode in p.files) for p in (agent, *agent.children))
    assert [p.stopped for p in snapshot(FIXTURES / "gpu-jobs3" / "sigstop" / "stopped").roots] == [True]
    assert [p.stopped for p in snapshot(FIXTURES / "gpu-jobs3" / "sigstop" / "resumed").roots] == [False]
    [agent] = snapshot(FIXTURES / "gpu-jobs4" / "elastic" / "restarting").roots
    assert "torch.distributed.run" in agent.command and len(agent.children) == 2
    assert all(c.etimes < agent.etimes for c in agent.children)


@pytest.mark.parametrize(("name", "moment"), CASES, ids=[n for n, _ in CASES])
def test_the_first_line_says_what_the_job_was_doing(verdicts, name, moment):
    assert not (wrong := misread(moment, verdicts[name])), wrong


@pytest.mark.parametrize("name", [n for n, m in CASES if m["phase"] == "training" and m["writer"] == "alive"])
def test_a_live_job_that_stops_moving_is_silent(name, tmp_path):
    v = asyncio.run(replay(FIXTURES / name, tmp_path, later=MOVED_ON_S))
    assert (v.phase, v.level) == (Phase.SILENT, Level.CRIT), v.headline
