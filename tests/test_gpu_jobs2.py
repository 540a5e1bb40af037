"""Issue 20's real jobs on an H200 (tests/fixtures/gpu-jobs2/README.md), probed again here: each moment's log
folder as it was (byte-exact copies, ages from the snapshot's stat), every process of the snapshot as a stand-in
that works where it worked and holds what it held (for writing, read-only, a deleted inode), started as long
before the log's last write as it was, and the snapshot's nvidia-smi readings — each first line judged against
the expectation written before any runbot answer was read (`<job>/expected.toml`)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import shutil
import subprocess
import sys
import time
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from bot.core.verdict import Level, Phase
from bot.probe.checkup import check
from bot.probe.runners import LocalRunner
from tests.corpus import judge
from tests.standins import fake_nvidia_smi, path_with, set_age
from tests.test_gpu_jobs import run  # the same configuration as the first device run (gpu-jobs2/runbot.toml)

JOBS = Path(__file__).parent / "fixtures" / "gpu-jobs2"
DEVICE_LOGS = "/tmp/runbot-jobs/capture/logs/"
MOVED_ON_S = 15 * 60.0


@dataclass(frozen=True)
class Proc:
    """One process of the snapshot: where it worked, how long it had run, what it held under the logs."""

    pid: int
    ppid: int
    etimes: int
    cwd: str
    command: str
    files: tuple[tuple[str, str], ...]  # (device path, "w" | "r"); a deleted inode's path ends in " (deleted)"
    children: list["Proc"] = field(default_factory=list)


@dataclass(frozen=True)
class Snapshot:
    clock: float
    mtimes: dict[str, float]  # file name -> mtime, before runbot ran
    roots: list[Proc]  # the job's process and the processes beside it, each with its tree
    readings: list[str]  # nvidia-smi's three answers
    last_event: float


_BLOCK = re.compile(r"^### pid (\d+): (.*)\n# cwd -> (.*) etimes=(\d+) ppid=(\d+)\n# ls -l /proc/\d+/fd\n((?:(?!###|---|job |other ).*\n)*)",
                    re.M)
_FD = re.compile(r"^l(r-x|-wx|rwx)\S* .*? \d+ -> (" + re.escape(DEVICE_LOGS) + r".*)$", re.M)


def snapshot(folder: Path) -> Snapshot:
    text = (folder / "snapshot.txt").read_text()
    before = text.split("--- processes (before runbot)")[0]
    procs_text = text.split("--- processes (before runbot)")[1].split("--- ps -eo")[0]
    procs = {int(m[1]): Proc(int(m[1]), int(m[5]), int(m[4]), m[3], m[2].strip(),
                             tuple((path, "r" if mode == "r-x" else "w") for mode, path in _FD.findall(m[6])))
             for m in _BLOCK.finditer(procs_text)}
    roots = []
    for p in procs.values():
        (procs[p.ppid].children if p.ppid in procs else roots).append(p)
    smi = text.split("(3 readings)\n", 1)[1].split("\n--- ", 1)[0]
    return Snapshot(
        clock=float(re.search(r"^clock=(\S+)", text, re.M)[1]),
        mtimes={Path(p).name: float(t) for p, t in re.findall(r"^(/\S+) size=\d+ mtime=(\S+)", before, re.M)},
        roots=roots,
        readings=[re.sub(r"^rc=\d+\n?", "", r.strip(), flags=re.M).strip() + "\n" for r in re.split(r"^# t=\S+\n", smi, flags=re.M)[1:]],
        last_event=float(re.search(r"last_event=(\S+)", text)[1]),
    )


def cases() -> list[tuple[str, dict]]:
    return [(f"{e.parent.name}/{m['name']}", m) for e in sorted(JOBS.glob("*/expected.toml"))
            for m in tomllib.loads(e.read_text())["moment"]]


CASES = cases()

# A stand-in: works in its folder, holds its files as the real process did, starts its children, says "ready",
# sleeps. Its command line carries the real one, so ps shows what the probe saw (a python, a TensorBoard...).
_STANDIN = r"""
import json, os, subprocess, sys, time
spec = json.loads(sys.argv[1])
os.chdir(spec["cwd"])
held = [open(path, "ab" if mode == "w" else "rb") for path, mode in spec["files"]]
kids = [subprocess.Popen([sys.executable, "-c", os.environ["STANDIN"], json.dumps(k), *k["argv"]], stdout=subprocess.PIPE)
        for k in spec["children"]]
for k in kids:
    k.stdout.readline()
print("ready", flush=True)
time.sleep(600)
"""


def _spec(p: Proc, logs: Path, scratch: Path) -> dict:
    where = lambda device: logs / device[len(DEVICE_LOGS):].split("/", 1)[1] if device.startswith(DEVICE_LOGS) else scratch
    return {"cwd": str(where(p.cwd + "/x").parent if p.cwd.startswith(DEVICE_LOGS) else scratch),
            "files": [(str(where(path.removesuffix(" (deleted)"))), mode) for path, mode in p.files],
            "children": [_spec(c, logs, scratch) for c in p.children], "argv": p.command.split()[:12]}


@contextlib.contextmanager
def standins(roots: list[Proc], logs: Path, scratch: Path):
    started = []
    try:
        for p in roots:
            spec = _spec(p, logs, scratch)
            proc = subprocess.Popen([sys.executable, "-c", _STANDIN, json.dumps(spec), *spec["argv"]], stdout=subprocess.PIPE,
                                    start_new_session=True, env={**os.environ, "STANDIN": _STANDIN})
            started.append(proc)
            assert proc.stdout.readline() == b"ready\n"
        yield started
    finally:
        for proc in started:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, 9)
            proc.wait()


async def probe(name: str, tmp: Path, later: float = 0.0):
    moment = JOBS / name
    snap = snapshot(moment)
    logs, scratch = tmp / "logs", tmp / "elsewhere"
    scratch.mkdir(parents=True)
    deleted = {Path(path).name.removesuffix(" (deleted)") for p in _all(snap.roots) for path, _ in p.files if path.endswith(" (deleted)")}
    if deleted:  # the writer's old inode, deleted under it: what the log held at the last moment it was still there
        shutil.copytree(moment.parent / "training" / "log", logs)
    else:
        shutil.copytree(moment / "log", logs)
    fake_nvidia_smi(tmp / "bin", [r.replace("\n", "").replace(" ", "").replace(",", ", ") + "\n" for r in snap.readings])
    with standins(snap.roots, logs, scratch) as started:
        for name_ in deleted:
            (logs / name_).unlink()
            shutil.copy2(moment / "log" / name_, logs / name_)
            for proc in started:
                for fd in os.listdir(f"/proc/{proc.pid}/fd"):
                    if os.readlink(f"/proc/{proc.pid}/fd/{fd}").endswith(f"/{name_} (deleted)"):
                        age = snap.clock - snap.last_event + later
                        os.utime(f"/proc/{proc.pid}/fd/{fd}", (time.time() - age, time.time() - age))
        # With nobody writing the log (or its renamed or deleted self), when the processes in its folder started says who may have written it last:
        # each stand-in starts as long before the log's last write as its process did (at most the log's age).
        if not any(mode == "w" and Path(path).name.startswith("train.log") for p in _all(snap.roots) for path, mode in p.files):
            age = snap.clock - max(snap.mtimes.values()) + later
            await asyncio.sleep(max([min(p.etimes, age - 1) for p in _all(snap.roots)] + [0.0]))
        for file, mtime in snap.mtimes.items():
            set_age(logs / file, snap.clock - mtime + later)
        return await check(run(logs / "train.log"), LocalRunner(path_with(tmp / "bin")))


def _all(roots: list[Proc]) -> list[Proc]:
    return [q for p in roots for q in (p, *_all(p.children))]


@pytest.fixture(scope="module")
def verdicts(tmp_path_factory):
    async def all_of_them():
        return await asyncio.gather(*(probe(n, tmp_path_factory.mktemp("job")) for n, _ in CASES))

    return dict(zip((n for n, _ in CASES), asyncio.run(all_of_them())))


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
    v = verdicts[name]
    wrong = judge(moment["phase"], moment["level"], moment.get("must_include", ()), moment.get("must_exclude", ()), v)
    assert not wrong, f"{'; '.join(wrong)}\n  want: {moment['headline']}\n  got:  {v.headline}"


@pytest.mark.parametrize("name", [n for n, m in CASES if m["phase"] == "training" and m["writer"] == "alive"
                                  and not n.startswith("lit-rich-busy/")])
def test_a_live_job_that_stops_moving_is_silent(name, tmp_path):
    v = asyncio.run(probe(name, tmp_path, later=MOVED_ON_S))
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
