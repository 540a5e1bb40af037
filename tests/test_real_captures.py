"""The real captures, replayed through the real probe: the log as it was at each timeline sample,
a live writer, and a stand-in nvidia-smi printing that moment's readings."""

from __future__ import annotations

import asyncio
import re
from dataclasses import dataclass
from pathlib import Path

import pytest

from bot.probe.checkup import check
from bot.probe.runners import LocalRunner
from bot.core.verdict import Phase
from bot.probe.replay import DefaultRun
from tests.standins import REAL_FIXTURES, fake_nvidia_smi, path_with, set_age, writer_holding

OK_LOG = (REAL_FIXTURES / "train_ok.log").read_bytes()
OOM_LOG = (REAL_FIXTURES / "train_oom.log").read_bytes()


def real_run(log: str, **kw) -> DefaultRun:
    """The real run's configuration: three GPU samples, the target on GPU 0."""
    return DefaultRun("dflash", log, **{"gpu_samples": 3, "gpus": {"target": [0]}, **kw})


@dataclass
class Sample:
    t: float
    size: int
    mtime: int
    smi: list[str]


def timeline() -> list[Sample]:
    samples = []
    for block in (REAL_FIXTURES / "timeline_ok.txt").read_text().split("=== ")[1:]:
        head = re.match(r"t=(\S+) size=(\d+) mtime=(\d+)", block)
        smi = block.split("--- smi\n", 1)[1].split("--- apps", 1)[0].strip().splitlines()
        samples.append(Sample(float(head[1]), int(head[2]), int(head[3]), smi))
    return samples


def as_query(rows: list[str]) -> str:
    """The captured `index, N MiB, U %` rows, printed as the probe's own query prints them."""
    out = []
    for row in rows:
        index, mem, util = (c.strip() for c in row.split(","))
        out.append(f"{index}, {mem.split()[0]}, 143771, {util.split()[0]}")
    return "\n".join(out) + "\n"


def probe(tmp_path: Path, log_bytes: bytes, age: float, smi_rounds: list[str], *, alive: bool, **run_kw):
    log = tmp_path / "train.log"
    log.write_bytes(log_bytes)
    set_age(log, age)
    bin_dir = tmp_path / "bin"
    fake_nvidia_smi(bin_dir, smi_rounds)
    run = real_run(str(log), **run_kw)
    runner = LocalRunner(path_with(bin_dir))
    if alive:
        with writer_holding(log):
            return asyncio.run(check(run, runner))
    return asyncio.run(check(run, runner))


SAMPLES = timeline()


def expected(sample: Sample) -> tuple[Phase, str]:
    log = OK_LOG[: sample.size]
    if sample.size == 0:
        return Phase.STARTING, "no output yet (importing?)"
    if b"step=" not in log:
        if b"Loading weights" not in log:
            return Phase.STARTING, "last line: Target 0 on cuda:0"
        if b"219/219" in log:
            return Phase.LOADING, "loading weights 100% (219/219) done, waiting for the first step"
        return Phase.LOADING, "no steps yet — loading weights"
    if b"training done" in log:
        return Phase.FINISHED, "finished — last step 60 · loss 10.79; process exiting"
    last = re.findall(rb"step=(\d+)", log)[-1].decode()
    return Phase.TRAINING, f"step {last} · "


# Every distinct log size the timeline saw (a probe at each moment of the real run).
DISTINCT = list({s.size: i for i, s in enumerate(SAMPLES)}.values())


@pytest.mark.parametrize("i", DISTINCT, ids=[f"t{i}-size{SAMPLES[i].size}" for i in DISTINCT])
def test_each_moment_of_the_real_run(tmp_path, i):
    sample = SAMPLES[i]
    rounds = [as_query(s.smi) for s in SAMPLES[i : i + 3]]
    v = probe(tmp_path, OK_LOG[: sample.size], sample.t - sample.mtime, rounds, alive=True)
    phase, words = expected(sample)
    assert v.phase is phase, v.headline
    assert words in v.headline
    assert v.gpu is not None and v.gpu.by_index(1).cls == "idle"


def test_loading_bar_caught_in_the_middle_names_the_device(tmp_path):
    cut = OK_LOG[: OK_LOG.index(b"\rLoading weights:  55%")]
    v = probe(tmp_path, cut, 1, [as_query(SAMPLES[19].smi)], alive=True)
    assert v.headline == "no steps yet — loading weights 27% (59/219) — Target 0 on cuda:0"


def test_training_reads_gpu0_busy_across_samples(tmp_path):
    i = next(i for i, s in enumerate(SAMPLES) if s.size > 900)
    v = probe(tmp_path, OK_LOG[: SAMPLES[i].size], 0.5, [as_query(s.smi) for s in SAMPLES[i : i + 5]], alive=True, gpu_samples=5)
    assert v.phase is Phase.TRAINING
    assert v.gpu.by_index(0).cls in ("busy", "oscillating") and v.gpu.by_index(0).holds_memory


def test_oom_crash_with_the_writer_gone(tmp_path):
    idle = (REAL_FIXTURES / "nvidia-smi_q_nounits_idle.txt").read_text().rsplit("rc=", 1)[0]
    v = probe(tmp_path, OOM_LOG, 3, [idle], alive=False)
    assert v.phase is Phase.CRASHED
    assert v.headline.startswith("crashed — torch.OutOfMemoryError: CUDA out of memory.")
    assert v.headline.endswith("at step 10; process gone")


def test_finished_run_with_the_writer_gone(tmp_path):
    v = probe(tmp_path, OK_LOG, 40, [as_query(SAMPLES[-1].smi)], alive=False)
    assert (v.phase, v.headline) == (Phase.FINISHED, "finished — last step 60 · loss 10.79")


def test_silent_run_names_the_idle_gpu(tmp_path):
    cut = OK_LOG[: OK_LOG.index(b"step=12 ")]
    idle_rounds = ["0, 31395, 143771, 0\n1, 4, 143771, 0\n"] * 3
    v = probe(tmp_path, cut, 720, idle_rounds, alive=True)
    assert v.phase is Phase.SILENT
    assert v.headline.startswith("silent 12 min — last step 10; process alive")
    assert "idle" in v.headline


@pytest.mark.parametrize(
    "capture, words",
    [
        ("nvidia-smi_q_badindex.txt", "no devices were found"),
        ("nvidia-smi_q_badfield.txt", "bogus.field"),
    ],
)
def test_failing_nvidia_smi_is_reported_not_mistaken_for_idle(tmp_path, capture, words):
    text, rc = (REAL_FIXTURES / capture).read_text().rsplit("rc=", 1)
    log = tmp_path / "train.log"
    log.write_bytes(OK_LOG[:600])
    bin_dir = tmp_path / "bin"
    fake_nvidia_smi(bin_dir, [text], rc=int(rc))
    with writer_holding(log):
        v = asyncio.run(check(real_run(str(log)), LocalRunner(path_with(bin_dir))))
    assert v.phase is Phase.TRAINING
    assert v.gpu.error and words in v.gpu.error.lower()
