"""Real trainer jobs on an H200 (tests/fixtures/gpu-jobs/README.md), probed again here: each moment's log
folder as it was (byte-exact copies, ages from the snapshot's stat), the job's process holding the file it
held, the snapshot's nvidia-smi readings — and the first line judged against the expectation written
before any runbot answer was read (`<job>/expected.toml`)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import shutil
import tomllib
from dataclasses import dataclass
from pathlib import Path

import pytest

from bot.core.verdict import Level, Phase
from bot.probe.checkup import check, verdict_from_output
from bot.probe.replay import DefaultRun
from bot.probe.runners import LocalRunner, RunResult
from tests.corpus import misread
from tests.standins import fake_nvidia_smi, path_with, set_age, writer_holding

JOBS = Path(__file__).parent / "fixtures" / "gpu-jobs"
MOVED_ON_S = 15 * 60.0
# Moments whose log copy was taken the instant the phase began, before the trainer wrote a byte of it
# (the driver knew from the job's side channel): judged on the probe runbot really ran 0.6 s later,
# which saw the eval bar and the shard writing.
FROM_THE_SAVED_PROBE = {"hf/evaluating", "hf/saving"}


def run(log: Path) -> DefaultRun:
    """The device run's configuration (gpu-jobs/runbot.toml)."""
    return DefaultRun("job", str(log), gpu_samples=3, silence_after=20.0, loading_grace=600.0, gpus={"trainer": [0]})


@dataclass(frozen=True)
class Snapshot:
    clock: float
    alive: bool
    mtimes: dict[str, float]  # file name -> mtime, before runbot ran
    held: str | None  # the file the job's stdout was (train.log, or train.log.1 after the rotation)
    readings: list[str]  # nvidia-smi's three answers


def snapshot(folder: Path) -> Snapshot:
    text = (folder / "snapshot.txt").read_text()
    before = text.split("--- processes (before runbot)")[0]
    held = re.search(r"^l-wx\S* .*? 1 -> (\S+)$", text, re.M)
    smi = text.split("(3 readings)\n", 1)[1].split("\n--- ", 1)[0]
    return Snapshot(
        clock=float(re.search(r"^clock=(\S+)", text, re.M)[1]),
        alive="job_alive=yes" in text.split("\n", 3)[2],
        mtimes={Path(p).name: float(t) for p, t in re.findall(r"^(/\S+) size=\d+ mtime=(\S+)", before, re.M)},
        held=Path(held[1]).name if held and "/logs/" in held[1] else None,
        readings=[r.strip() + "\n" for r in re.split(r"^# t=\S+\n", smi, flags=re.M)[1:]],
    )


def cases() -> list[tuple[str, dict]]:
    out = []
    for expected in sorted(JOBS.glob("*/expected.toml")):
        job = expected.parent.name
        for m in tomllib.loads(expected.read_text())["moment"]:
            if (expected.parent / m["name"] / "log").is_dir():
                out.append((f"{job}/{m['name']}", m))
    return out


CASES = cases()


def replay(name: str):
    [probe_file] = (JOBS / name / "probe-status").glob("*.probe")
    meta = json.loads(probe_file.with_suffix(".json").read_text())
    result = RunResult(stdout=probe_file.read_bytes(), stderr=b"", exit_status=meta["exit_status"])
    return verdict_from_output(run(Path("/tmp/runbot-jobs/capture/logs") / name.split("/")[0] / "train.log"), result, meta["nonce"])


async def probe(name: str, tmp: Path, later: float = 0.0):
    moment = JOBS / name
    snap = snapshot(moment)
    logs = tmp / "logs"
    shutil.copytree(moment / "log", logs)
    fake_nvidia_smi(tmp / "bin", [r.replace("\n", "").replace(" ", "").replace(",", ", ") + "\n" for r in snap.readings])
    with contextlib.ExitStack() as stack:
        if snap.alive and snap.held:
            stack.enter_context(writer_holding(logs / snap.held))
        for file, mtime in snap.mtimes.items():
            set_age(logs / file, snap.clock - mtime + later)
        return await check(run(logs / "train.log"), LocalRunner(path_with(tmp / "bin")))


@pytest.fixture(scope="module")
def verdicts(tmp_path_factory):
    async def all_of_them():
        return await asyncio.gather(*(probe(n, tmp_path_factory.mktemp("job")) for n, _ in CASES))

    found = dict(zip((n for n, _ in CASES), asyncio.run(all_of_them())))
    return {**found, **{n: replay(n) for n in FROM_THE_SAVED_PROBE}}


def test_every_moment_of_the_device_run_is_here():
    assert len(CASES) == 23 and {n.split("/")[0] for n, _ in CASES} == {
        "hf", "hf-nan", "lit-tqdm", "lit-rich", "dl-killed", "rotate", "compile"}


@pytest.mark.parametrize(("name", "moment"), CASES, ids=[n for n, _ in CASES])
def test_the_first_line_says_what_the_job_was_doing(verdicts, name, moment):
    assert not (wrong := misread(moment, verdicts[name])), wrong


@pytest.mark.parametrize("name", [n for n, m in CASES if m["phase"] == "training" and m["writer"] == "alive"])
def test_a_live_job_that_stops_moving_is_silent(name, tmp_path):
    v = asyncio.run(probe(name, tmp_path, later=MOVED_ON_S))
    assert (v.phase, v.level) == (Phase.SILENT, Level.CRIT), v.headline
