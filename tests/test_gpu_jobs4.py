"""Round 9's real jobs on an H200 (tests/fixtures/gpu-jobs4/README.md): torchrun's agent restarting a failed worker
group (static and c10d rendezvous), an HF Trainer stopped early, a Lightning validation step that raises, a loop logging
JSON lines, nested tqdm bars. Each moment replayed (tests/gpu_replay.py) and its first line judged against the
expectation written before any runbot answer was read (`<job>/expected.toml`)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from bot.core.verdict import Level, Phase
from tests.corpus import judge
from tests.gpu_replay import cases, snapshot
from tests.gpu_replay import probe as replay

JOBS = Path(__file__).parent / "fixtures" / "gpu-jobs4"
MOVED_ON_S = 15 * 60.0
CASES = cases(JOBS)


@pytest.fixture(scope="module")
def verdicts(tmp_path_factory):
    async def all_of_them():
        return await asyncio.gather(*(replay(JOBS / n, tmp_path_factory.mktemp("job")) for n, _ in CASES))

    return dict(zip((n for n, _ in CASES), asyncio.run(all_of_them())))


def test_every_moment_of_the_device_run_is_here():
    assert len(CASES) == 13 and {n.split("/")[0] for n, _ in CASES} == {
        "elastic", "elastic-c10d", "hf-early", "lit-val-crash", "jsonl", "nested"}


def test_the_snapshots_hold_what_the_replays_rest_on():
    """At the restart, torchrun's agent writes the log with two new workers under it, started after the failure."""
    [agent] = snapshot(JOBS / "elastic" / "restarting").roots
    assert "torch.distributed.run" in agent.command and len(agent.children) == 2
    assert all(c.etimes < agent.etimes for c in agent.children)


@pytest.mark.parametrize(("name", "moment"), CASES, ids=[n for n, _ in CASES])
def test_the_first_line_says_what_the_job_was_doing(verdicts, name, moment):
    v = verdicts[name]
    wrong = judge(moment["phase"], moment["level"], moment.get("must_include", ()), moment.get("must_exclude", ()), v)
    assert not wrong, f"{'; '.join(wrong)}\n  want: {moment['headline']}\n  got:  {v.headline}"


@pytest.mark.parametrize("name", [n for n, m in CASES if m["phase"] == "training" and m["writer"] == "alive"])
def test_a_live_job_that_stops_moving_is_silent(name, tmp_path):
    v = asyncio.run(replay(JOBS / name, tmp_path, later=MOVED_ON_S))
    assert (v.phase, v.level) == (Phase.SILENT, Level.CRIT), v.headline
