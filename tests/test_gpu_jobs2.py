"""Issue 20's real jobs on an H200 (tests/fixtures/gpu-jobs2/README.md), probed again here (tests/gpu_replay.py):
each first line judged against the expectation written before any runbot answer was read (`<job>/expected.toml`)."""

from __future__ import annotations

import asyncio
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from bot.core.verdict import Level, Phase
from bot.probe.checkup import check
from bot.probe.runners import LocalRunner
from tests.corpus import misread
from tests.gpu_replay import DEVICE_LOGS, Proc, cases, replay_all, snapshot, standins
from tests.gpu_replay import probe as replay
from tests.standins import fake_nvidia_smi, path_with, set_age
from tests.test_gpu_jobs import run  # the same configuration as the first device run (gpu-jobs2/runbot.toml)

JOBS = Path(__file__).parent / "fixtures" / "gpu-jobs2"
MOVED_ON_S = 15 * 60.0
CASES = cases(JOBS)


@pytest.fixture(scope="module")
def verdicts(tmp_path_factory):
    return replay_all(JOBS, CASES, tmp_path_factory.mktemp)


def test_every_moment_of_the_device_run_is_here():
    assert len(CASES) == 16 and {n.split("/")[0] for n, _ in CASES} == {
        "lit-rich-busy", "renamed", "deleted", "tb-dead", "late-start"}


def test_the_snapshots_hold_what_the_classes_are_about():
    """The replays rest on these: TensorBoard's data server holds the event file read-only, its python parent
    nothing of the folder; the second job started after the dead run's last write; the deleted log's writer."""
    tb = snapshot(JOBS / "tb-dead" / "dead-4s").roots
    [board] = [p for p in tb if "tensorboard" in p.command]
    assert board.files == () and [c.files for c in board.children] == [((DEVICE_LOGS + "tb-dead/events.out.tfevents."
                                                                          "1796171884.vm.8049.0", "r"),)]
    late = snapshot(JOBS / "late-start" / "second-6s")
    [second] = late.roots
    assert late.clock - second.etimes > late.mtimes["train.log"] + 2
    [writer] = snapshot(JOBS / "deleted" / "deleted").roots
    assert writer.files == ((DEVICE_LOGS + "deleted/train.log (deleted)", "w"),) * 2


@pytest.mark.parametrize(("name", "moment"), CASES, ids=[n for n, _ in CASES])
def test_the_first_line_says_what_the_job_was_doing(verdicts, name, moment):
    assert not (wrong := misread(moment, verdicts[name])), wrong


@pytest.mark.parametrize("name", [n for n, m in CASES if m["phase"] == "training" and m["writer"] == "alive"
                                  and not n.startswith("lit-rich-busy/")])
def test_a_live_job_that_stops_moving_is_silent(name, tmp_path):
    v = asyncio.run(replay(JOBS / name, tmp_path, later=MOVED_ON_S))
    assert (v.phase, v.level) == (Phase.SILENT, Level.CRIT), v.headline


# ---------------------------------------------------------------- each class on its own, over the captures' real text
def _probe_here(log: Path, bin_dir: Path, readings: list[str], cwd: Path | None = None):
    """The real probe on `log`, from `cwd` (runbot started in the log's folder), with nvidia-smi's readings."""
    fake_nvidia_smi(bin_dir, readings)
    return asyncio.run(check(run(log), LocalRunner(path_with(bin_dir)))) if cwd is None else _from(log, bin_dir, cwd)


def _from(log: Path, bin_dir: Path, cwd: Path):
    from bot.probe.checkup import verdict_from_output
    from bot.probe.runners import RunResult
    from bot.probe.script import build_script

    out = subprocess.run(["bash", "-c", build_script(run(log), "n0nce1234")], cwd=cwd, capture_output=True, timeout=60,
                         env={**os.environ, **path_with(bin_dir)})
    return verdict_from_output(run(log), RunResult(stdout=out.stdout, stderr=out.stderr, exit_status=out.returncode), "n0nce1234")


IDLE = ["0, 0, 143771, 0\n"]
DEAD_RUN = JOBS / "tb-dead" / "dead-4s" / "log" / "train.log"  # a plain loop kill -9'ed at step 89


def _tensorboard(folder: Path, standin_logs: Path, scratch: Path):
    """TensorBoard as the capture saw it: a python holding nothing of the folder, its data server holding the
    event file read-only."""
    server = Proc(2, 1, 0, DEVICE_LOGS + "x", "/opt/torch/.venv/lib/python3.12/site-packages/tensorboard_data_server/bin/server",
                  ((DEVICE_LOGS + "x/events.out.tfevents.1796171884.vm.8049.0", "r"),))
    return Proc(1, 0, 0, DEVICE_LOGS + "x", "/opt/torch/.venv/bin/python /opt/torch/.venv/bin/tensorboard --logdir .", (),
                [server])


def _job_started_later():
    return Proc(1, 0, 0, DEVICE_LOGS + "x", "python3 -u plain_job.py --mode rotate", ((DEVICE_LOGS + "x/eval.log", "w"),))


def _per_write_loop():
    return Proc(1, 0, 0, DEVICE_LOGS + "x", "python3 train.py --out .", ())


# who: the processes in the log's folder; before: started before the log's last write; want: the verdict's phase.
WHO_WRITES = [
    ("a TensorBoard in the folder of a dead run", _tensorboard, True, Phase.STOPPED),
    ("a job started in the folder after the log's last write", _job_started_later, False, Phase.STOPPED),
    ("a loop that opens its log per write, working there since before", _per_write_loop, True, Phase.TRAINING),
]


@pytest.mark.parametrize(("what", "who", "before", "want"), WHO_WRITES, ids=[w[0] for w in WHO_WRITES])
def test_who_writes_the_log(tmp_path, what, who, before, want):
    """Class 7: a process merely working in the log's folder is not its writer."""
    logs, scratch = tmp_path / "logs", tmp_path / "elsewhere"
    logs.mkdir(), scratch.mkdir()
    (logs / "events.out.tfevents.1796171884.vm.8049.0").write_bytes(
        (JOBS / "tb-dead" / "dead-4s" / "log" / "events.out.tfevents.1796171884.vm.8049.0").read_bytes())
    log = logs / "train.log"
    if not before:
        shutil.copyfile(DEAD_RUN, log)
        set_age(log, 10)
    with standins([who(logs, logs, scratch) if who is _tensorboard else who()], logs, scratch):
        if before:
            time.sleep(1.1)  # the processes' start, then the run's last write (ps counts whole seconds)
            shutil.copyfile(DEAD_RUN, log)
        v = _probe_here(log, tmp_path / "bin", IDLE)
    assert v.phase is want, v.headline
    if want is Phase.STOPPED:
        assert "after step 89" in v.headline and "alive" not in v.headline, v.headline


def test_the_probe_s_own_children_never_count(tmp_path):
    """Class 7: runbot started from the log's folder; its nvidia-smi is a python wrapper, still reading while the
    probe looks at the folder. The probe's own child is not the dead run's writer."""
    logs = tmp_path / "logs"
    logs.mkdir()
    log = logs / "train.log"
    shutil.copyfile(DEAD_RUN, log)
    set_age(log, 30)
    bin_dir = tmp_path / "bin"
    fake_nvidia_smi(bin_dir, IDLE)
    real = bin_dir / "nvidia-smi"
    real.rename(bin_dir / "nvidia-smi.real")
    real.write_text(f"#!{sys.executable}\nimport os, sys, time\ntime.sleep(3)\n"
                    f"os.execv('/bin/bash', ['bash', {str(bin_dir / 'nvidia-smi.real')!r}, *sys.argv[1:]])\n")
    real.chmod(0o755)
    v = _from(log, bin_dir, logs)
    assert v.phase is Phase.STOPPED and "alive" not in v.headline, v.headline


RICH_LOG = JOBS / "lit-rich-busy" / "training-10s" / "log" / "train.log"  # start-up lines only: the bar draws on no file
# readings (the captures' own), the log's age, and what the first line must say
RICH_BAR = [
    ("GPU-bound, 12 s in", ["0, 15635, 143771, 97\n", "0, 15635, 143771, 94\n", "0, 15635, 143771, 80\n"], 12,
     Phase.TRAINING, Level.NOTE, "busy"),
    ("GPU-bound, 37 s in: past silence_after", ["0, 15635, 143771, 95\n", "0, 15635, 143771, 90\n", "0, 15635, 143771, 94\n"],
     37, Phase.TRAINING, Level.NOTE, "busy"),
    ("stalled, GPU idle with its memory", ["0, 15635, 143771, 0\n"], 57, Phase.SILENT, Level.CRIT, "idle (memory held)"),
    ("just started, GPU idle", ["0, 15635, 143771, 0\n"], 10, Phase.TRAINING, Level.NOTE, "rich progress bar"),
    ("data-bound (gpu-jobs lit-rich), GPU low", ["0, 1901, 143771, 4\n", "0, 1901, 143771, 3\n", "0, 1901, 143771, 4\n"], 30,
     Phase.TRAINING, Level.NOTE, "rich progress bar"),
]


@pytest.mark.parametrize(("what", "readings", "age", "phase", "level", "says"), RICH_BAR, ids=[r[0] for r in RICH_BAR])
def test_a_rich_bar_run_is_read_from_its_gpu(tmp_path, what, readings, age, phase, level, says):
    """Class 8: Lightning's rich bar writes nothing to the file; the writer alive, the run's GPU says the rest."""
    from tests.standins import writer_holding

    log = tmp_path / "train.log"
    shutil.copyfile(RICH_LOG, log)
    with writer_holding(log):
        set_age(log, age)
        v = _probe_here(log, tmp_path / "bin", readings)
    assert (v.phase, v.level) == (phase, level) and says in v.headline, v.headline


REPLACED = [  # how the log was replaced under its writer, and what the first line names
    ("renamed to .1, a new empty file", "mv", "log replaced", "train.log.1"),
    ("deleted, a new empty file", "rm", "log deleted", "its deleted train.log"),
]


@pytest.mark.parametrize(("what", "how", "says", "names"), REPLACED, ids=[r[0] for r in REPLACED])
def test_a_log_replaced_under_its_writer_is_followed(tmp_path, what, how, says, names):
    """Class 9: the configured path is a new empty file nobody holds; the writer writes on where its descriptor goes."""
    from tests.standins import writer_holding

    log = tmp_path / "train.log"
    shutil.copyfile(JOBS / "renamed" / "renamed-later" / "log" / "train.log.1", log)  # 252 real steps
    with writer_holding(log) as writer:
        if how == "mv":
            log.rename(tmp_path / "train.log.1")
        else:
            log.unlink()
        log.touch()
        set_age(log, 28)
        v = _probe_here(log, tmp_path / "bin", ["0, 3901, 143771, 11\n"])
    assert v.phase is Phase.TRAINING and v.level is Level.WARN, v.headline
    assert re.match(f"{says} (28|29) s ago; pid {writer.pid} still writes {names} — step 252", v.headline), v.headline
