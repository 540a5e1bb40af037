"""Stand-ins for the tests: a replaying nvidia-smi on PATH, and a process that holds a log open."""

from __future__ import annotations

import contextlib
import os
import shlex
import subprocess
import time
from pathlib import Path
from typing import Iterator, Sequence

REPO = Path(__file__).resolve().parents[1]
# ../shared/fixtures/real, copied byte for byte with its README: the tests need nothing beside the clone.
SHARED_REAL = REPO / "tests" / "fixtures" / "real"


def fake_nvidia_smi(bin_dir: Path, rounds: Sequence[str], rc: int = 0) -> Path:
    """An nvidia-smi that prints rounds[0], rounds[1], … on successive calls (the last one repeats)."""
    bin_dir.mkdir(parents=True, exist_ok=True)
    data = bin_dir / "smi-rounds"
    data.mkdir(exist_ok=True)
    for i, text in enumerate(rounds):
        (data / str(i)).write_text(text)
    counter = data / "counter"
    counter.write_text("0")
    script = bin_dir / "nvidia-smi"
    script.write_text(
        "#!/usr/bin/env bash\n"
        f"d={shlex.quote(str(data))}; n=$(cat \"$d/counter\"); last={len(rounds) - 1}\n"
        "i=$(( n < last ? n : last )); echo $((n + 1)) > \"$d/counter\"\n"
        "cat \"$d/$i\"\n"
        f"exit {rc}\n"
    )
    script.chmod(0o755)
    return script


def path_with(bin_dir: Path) -> dict[str, str]:
    return {"PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}"}


@contextlib.contextmanager
def writer_holding(log: Path, *, mode: str = ">>") -> Iterator[subprocess.Popen]:
    """A live process with `log` open (for writing with '>>', reading with '<'), like a training job."""
    proc = subprocess.Popen(["bash", "-c", f'exec 3{mode}"$1"; exec sleep 300', "train.py", str(log)])
    try:
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:  # wait until the fd is really open
            if any(os.path.realpath(f"/proc/{proc.pid}/fd/{fd}") == str(log.resolve())
                   for fd in _fds(proc.pid)):
                break
            time.sleep(0.01)
        yield proc
    finally:
        proc.kill()
        proc.wait()


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
