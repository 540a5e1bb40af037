"""Replaying a device run's moments (bench/gpu/run_jobs.sh): each moment's log folder as it was (byte-exact copies,
ages from the snapshot's stat), every process of the snapshot as a stand-in that works where it worked, holds what it
held (for writing, read-only, a deleted inode) and is stopped where it was, started as long before the log's last
write as it was, and the snapshot's nvidia-smi readings — then the real probe."""

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

from bot.core.verdict import Verdict
from bot.probe.checkup import check
from bot.probe.runners import LocalRunner
from tests.standins import fake_nvidia_smi, path_with, set_age
from tests.test_gpu_jobs import run  # the configuration of every device run (gpu-jobs*/runbot.toml)

DEVICE_LOGS = "/tmp/runbot-jobs/capture/logs/"


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
    stopped: bool = False  # ps showed it in state T (SIGSTOP, Ctrl-Z, a debugger)


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
    procs_text, ps_text = text.split("--- processes (before runbot)")[1].split("--- ps -eo", 1)
    states = {int(m[1]): m[2] for m in re.finditer(r"^ *(\d+) +\d+ +\d+ +(\S+) ", ps_text.split("\n--- ", 1)[0], re.M)}
    procs = {int(m[1]): Proc(int(m[1]), int(m[5]), int(m[4]), m[3], m[2].strip(),
                             tuple((path, "r" if mode == "r-x" else "w") for mode, path in _FD.findall(m[6])),
                             stopped=states.get(int(m[1]), "").startswith("T"))
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
        last_event=float(re.search(r"last_event=(\S+)", text)[1]) if re.search(r"last_event=\d", text) else float("nan"),
    )


def cases(jobs: Path) -> list[tuple[str, dict]]:
    """Every moment of a device run: `<job>/<moment>` and its expectation (`<job>/expected.toml`)."""
    return [(f"{e.parent.name}/{m['name']}", m) for e in sorted(jobs.glob("*/expected.toml"))
            for m in tomllib.loads(e.read_text())["moment"]]


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
if spec["stopped"]:
    os.kill(os.getpid(), 19)  # SIGSTOP: as ps saw it
time.sleep(600)
"""


def _spec(p: Proc, logs: Path, scratch: Path) -> dict:
    where = lambda device: logs / device[len(DEVICE_LOGS):].split("/", 1)[1] if device.startswith(DEVICE_LOGS) else scratch
    return {"cwd": str(where(p.cwd + "/x").parent if p.cwd.startswith(DEVICE_LOGS) else scratch),
            "files": [(str(where(path.removesuffix(" (deleted)"))), mode) for path, mode in p.files],
            "children": [_spec(c, logs, scratch) for c in p.children], "argv": p.command.split()[:12], "stopped": p.stopped}


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


async def probe(moment: Path, tmp: Path, later: float = 0.0):
    """The real probe again on one moment of a device run, `later` seconds on."""
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


def replay_all(jobs: Path, found: list[tuple[str, dict]], mktemp) -> dict[str, Verdict]:
    """Every moment of a device run replayed at once (each in its own folder from `mktemp`)."""
    async def all_of_them():
        return await asyncio.gather(*(probe(jobs / name, mktemp("job")) for name, _ in found))

    return dict(zip((name for name, _ in found), asyncio.run(all_of_them())))
