"""Stand-ins for the tests: a replaying nvidia-smi on PATH, and a process that holds a log open."""

from __future__ import annotations

import contextlib
import os
import re
import shlex
import subprocess
import time
from pathlib import Path
from typing import Iterator, Sequence

from bot.demo.smi import NOT_AVAILABLE, Samples, SmiGpu, bus_id, utilization_report

REPO = Path(__file__).resolve().parents[1]
# Real captures from a GPU job, kept in the repository (copied byte for byte from the team's shared folder, with its
# README): the tests read only this, never anything beside the clone.
REAL_FIXTURES = REPO / "tests" / "fixtures" / "real"


_ROW = re.compile(r"\s*([0-9]+)\s*,(.*)")  # a data row of the old four-column query: `0, 3133, 143771, 14`


def fake_nvidia_smi(bin_dir: Path, rounds: Sequence[str], rc: int = 0, *, window: str | None = None,
                    window_rc: int | None = None) -> Path:
    """An nvidia-smi that prints rounds[0], rounds[1], … on successive `--query-gpu` calls (the last one repeats),
    and for `-q -d UTILIZATION` the driver's window.

    Rounds are given as the old query printed them (`index, memory.used, memory.total, utilization.gpu`); asked
    for `index,pci.bus_id,…`, each row gets its GPU's bus id (bot.demo.smi.bus_id) after the index, anything else
    is printed as it is (error text). The window is `window` verbatim, with exit status `window_rc` (default
    `rc`); without one, it is synthesised from the rounds as a real driver prints it: per GPU seen in them, its
    bus id's block with Max, Min and Avg over the rounds, 71 samples over 14 s. A failing nvidia-smi
    (rc != 0) fails `-q` alike, with rounds[0]'s text."""
    bin_dir.mkdir(parents=True, exist_ok=True)
    data = bin_dir / "smi-rounds"
    data.mkdir(exist_ok=True)
    for i, text in enumerate(rounds):
        (data / str(i)).write_text(text)
        (data / f"bus{i}").write_text("".join(_with_bus_id(line) for line in text.splitlines(keepends=True)))
    if window is None:
        window = synthesised_window(rounds) if rc == 0 else rounds[0]
    (data / "window").write_text(window)
    counter = data / "counter"  # --query-gpu calls so far
    counter.write_text("0")
    script = bin_dir / "nvidia-smi"
    script.write_text(
        "#!/usr/bin/env bash\n"
        f"d={shlex.quote(str(data))}\n"
        f'case " $* " in *" -q "*) cat "$d/window"; exit {rc if window_rc is None else window_rc} ;; esac\n'
        # Two probes may read the GPUs at once (a sweep's groups): the count is read and written under a lock.
        'exec 9>"$d/lock"; command -v flock >/dev/null && flock 9\n'
        "n=$(cat \"$d/counter\"); last=" + str(len(rounds) - 1) + "\n"
        "i=$(( n < last ? n : last )); echo $((n + 1)) > \"$d/counter\"\n"
        'case " $* " in *" --query-gpu=index,pci.bus_id,"*) cat "$d/bus$i" ;; *) cat "$d/$i" ;; esac\n'
        f"exit {rc}\n"
    )
    script.chmod(0o755)
    return script


def _with_bus_id(line: str) -> str:
    m = _ROW.match(line)
    return f"{m[1]}, {bus_id(int(m[1]))},{m[2]}" + line[m.end():] if m and line.count(",") >= 3 else line


def synthesised_window(rounds: Sequence[str]) -> str:
    """`nvidia-smi -q -d UTILIZATION` for the GPUs of these rounds: each one's readings as its driver's window."""
    utils: dict[int, list[float | None]] = {}
    for text in rounds:
        for line in text.splitlines():
            if (m := _ROW.match(line)) and line.count(",") >= 3:
                last = line.rsplit(",", 1)[1].strip()
                utils.setdefault(int(m[1]), []).append(float(last) if re.fullmatch(r"[0-9]+", last) else None)
    gpus = []
    for index, seen in sorted(utils.items()):
        known = [u for u in seen if u is not None]
        now = f"{known[0]:.0f} %" if seen[0] is not None else "N/A"
        gpus.append(SmiGpu(bus_id(index), gpu=now, gpu_samples=Samples.of(known) if len(known) == len(seen)
                           else NOT_AVAILABLE))
    return utilization_report(gpus)


def path_with(bin_dir: Path) -> dict[str, str]:
    return {"PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}"}


@contextlib.contextmanager
def writer_holding(log: Path, *, mode: str = ">>") -> Iterator[subprocess.Popen]:
    """A live process with `log` open (for writing with '>>', reading with '<'), like a training job."""
    proc = subprocess.Popen(["bash", "-c", f'exec 3{mode}"$1"; exec sleep 300', "train.py", str(log)])
    try:
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:  # wait until the fd is really open
            if any(_target(proc.pid, fd) == str(log.resolve()) for fd in _fds(proc.pid)):
                break
            time.sleep(0.01)
        yield proc
    finally:
        proc.kill()
        proc.wait()


def _target(pid: int, fd: str) -> str | None:
    """Where a process's fd points, or None once it is gone (bash closes and opens fds while it execs)."""
    try:
        return os.readlink(f"/proc/{pid}/fd/{fd}")
    except OSError:
        return None


def _fds(pid: int) -> list[str]:
    try:
        return os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return []


def set_age(path: Path, seconds: float) -> None:
    """Make the log look last written `seconds` ago."""
    t = time.time() - seconds
    os.utime(path, (t, t))


@contextlib.contextmanager
def small_filesystem(folder: Path, size_kib: int = 512) -> Iterator[Path | None]:
    """A tmpfs of `size_kib` mounted at `folder` (root only: yields None where mounting is not allowed).

    For the state file's disk faults: fill it for "disk full", remount it read-only for "read-only"
    (as root, file permissions alone never stop a write)."""
    folder.mkdir(parents=True, exist_ok=True)
    if os.geteuid() != 0 or subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size_kib}k", "tmpfs", str(folder)],
                                           capture_output=True).returncode != 0:
        yield None
        return
    try:
        yield folder
    finally:
        subprocess.run(["umount", "-l", str(folder)], capture_output=True)


def remount_read_only(folder: Path) -> bool:
    return subprocess.run(["mount", "-o", "remount,ro", str(folder)], capture_output=True).returncode == 0


def fill(folder: Path) -> None:
    """Fill a small filesystem to the last byte."""
    fd = os.open(folder / "filler", os.O_WRONLY | os.O_CREAT)
    try:
        while os.write(fd, b"\0" * 4096):
            pass
    except OSError:
        pass
    finally:
        os.close(fd)


def immutable(*paths: Path) -> bool:
    """Make files unwritable even for root (chattr +i); False where the filesystem cannot."""
    return all(subprocess.run(["chattr", "+i", str(p)], capture_output=True).returncode == 0 for p in paths if p.exists())


def mutable(*paths: Path) -> None:
    for p in paths:
        subprocess.run(["chattr", "-i", str(p)], capture_output=True)


def peak_rss_bytes() -> int:
    """This process's own peak RSS (VmHWM). Not getrusage's ru_maxrss: Linux carries that over fork and exec,
    so a child of a big pytest process reports its parent's size (350 MB late in the suite) as its own."""
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmHWM:")) * 1024
