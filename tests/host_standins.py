"""Stand-ins for the host view's tests: CTs as real PID namespaces, a host nvidia-smi, real lxc cgroups (helpers)."""

from __future__ import annotations

import contextlib
import os
import shlex
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Sequence

CGROUP = Path("/sys/fs/cgroup")
# Training as the scan sees it: a python whose command line says so, with stdout (and a checkpoint) open for writing.
TRAIN = "import sys, time; ckpt = open(sys.argv[2], 'ab'); time.sleep(300)"


def can_make_namespaces() -> bool:
    """Whether this process may unshare a PID namespace (root, with util-linux's unshare and nsenter)."""
    if os.geteuid() != 0 or not (shutil.which("unshare") and shutil.which("nsenter")):
        return False
    return subprocess.run(["unshare", "--pid", "--fork", "--mount-proc", "true"], capture_output=True).returncode == 0


@dataclass
class CtProcess:
    """A CT made real enough: its init's host PID (what pct's stand-in enters) and its training's host PID."""

    vmid: int
    init_pid: int
    train_pid: int
    proc: subprocess.Popen


def _children(pid: int) -> list[int]:
    try:
        return [int(p) for p in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


def _target(pid: int, fd: str) -> str:
    """Where a process's descriptor points, or "" when it closed it since it was listed (python opens and closes
    files as it starts: the listing races it)."""
    try:
        return os.readlink(f"/proc/{pid}/fd/{fd}")
    except OSError:
        return ""


def _wait_for(what, timeout: float = 5.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if (found := what()):
            return found
        time.sleep(0.01)
    raise RuntimeError("stand-in did not come up")


@contextlib.contextmanager
def ct_namespaces(state: Path, cts: Sequence[tuple[int, str, Path | None]]) -> Iterator[list[CtProcess]]:
    """Per (vmid, name, log): a running CT for the pct stand-in in `state`, with its own PID and mount namespace
    and /proc; with a log, a python in it whose stdout is that log (appended) and which also writes `log`.ckpt."""
    made: list[CtProcess] = []
    try:
        for vmid, name, log in cts:
            inner = "exec </dev/null >/dev/null 2>&1; sleep 300 & wait"  # the CT's init writes nothing
            if log is not None:
                inner = (f"exec </dev/null >/dev/null 2>&1; {shlex.quote(sys.executable)} -c {shlex.quote(TRAIN)} train.py {shlex.quote(str(log) + '.ckpt')}"
                         f" >> {shlex.quote(str(log))} 2>&1 & wait")
            proc = subprocess.Popen(["unshare", "--pid", "--fork", "--mount-proc", "bash", "-c", inner],
                                    stdin=subprocess.DEVNULL, start_new_session=True)
            init = _wait_for(lambda: (_children(proc.pid) or [None])[0])
            train = _wait_for(lambda: (_children(init) or [None])[0])
            if log is not None:  # the python has opened its checkpoint once /proc shows it
                _wait_for(lambda: any(_target(train, fd).endswith(".ckpt") for fd in _fds(train)))
            (state / f"{vmid}.pid").write_text(str(init))
            (state / f"{vmid}.running").write_text(name)
            made.append(CtProcess(vmid, init, train, proc))
        yield made
    finally:
        for ct in made:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(ct.proc.pid, 9)
            ct.proc.wait()
            (state / f"{ct.vmid}.pid").unlink(missing_ok=True)


def _fds(pid: int) -> list[str]:
    try:
        return os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return []


def fake_host_smi(bin_dir: Path, gpus: Sequence[str], apps: Sequence[str] = (), *, rc: int = 0,
                  said: str = "") -> Path:
    """A host's nvidia-smi: `gpus` for --query-gpu (the host view's columns), `apps` for --query-compute-apps;
    rc != 0 fails both with `said` on stdout, as the driver prints "Insufficient Permissions"."""
    bin_dir.mkdir(parents=True, exist_ok=True)
    data = bin_dir / "host-smi"
    data.mkdir(exist_ok=True)
    (data / "gpus").write_text("".join(f"{row}\n" for row in gpus))
    (data / "apps").write_text("".join(f"{row}\n" for row in apps))
    script = bin_dir / "nvidia-smi"
    script.write_text(
        "#!/usr/bin/env bash\n"
        f"d={shlex.quote(str(data))}\n"
        f"if [ {rc} -ne 0 ]; then echo {shlex.quote(said)}; exit {rc}; fi\n"
        'case " $* " in *" --query-compute-apps="*) cat "$d/apps" ;; *" --query-gpu="*) cat "$d/gpus" ;;'
        ' *) echo "stand-in: unsupported: $*" >&2; exit 2 ;; esac\n')
    script.chmod(0o755)
    return script


def gpu_row(index: int, uuid: str, used: int = 0, total: int = 143771, util: int = 0) -> str:
    return f"{index}, 00000000:{0x18 + index:02X}:00.0, {uuid}, {used}, {total}, {util}"


def _cgroup_roots() -> list[tuple[Path, str]]:
    """Hierarchies a test may make an lxc/<vmid> cgroup in, and how /proc/PID/cgroup spells it there."""
    roots = []
    if (CGROUP / "cgroup.procs").exists() and (CGROUP / "cgroup.controllers").exists():
        roots.append((CGROUP, "cgroup v2"))
    if (CGROUP / "unified" / "cgroup.procs").exists():
        roots.append((CGROUP / "unified", "cgroup v2 (hybrid)"))
    if (CGROUP / "memory" / "cgroup.procs").exists():
        roots.append((CGROUP / "memory", "cgroup v1 memory"))
    return roots


@contextlib.contextmanager
def lxc_cgroups(placed: dict[int, Sequence[int]], only: str = "") -> Iterator[str | None]:
    """Move each vmid's PIDs into a real `lxc/<vmid>` cgroup, as Proxmox keeps a CT's processes, in the first
    hierarchy that lets us (whose name starts with `only`, when given). Yields which it used, or None where no
    cgroup could be made (not root, read-only cgroupfs): then nothing moved."""
    for root, spelling in _cgroup_roots():
        if not spelling.startswith(only):
            continue
        made: list[Path] = []
        moved: list[int] = []
        try:
            base = root / "lxc"
            fresh_base = not base.exists()
            base.mkdir(exist_ok=True)
            if fresh_base:
                made.append(base)
            for vmid, pids in placed.items():
                d = base / str(vmid)
                d.mkdir()
                made.append(d)
                for pid in pids:
                    (d / "cgroup.procs").write_text(str(pid))
                    moved.append(pid)
        except OSError:
            _undo(root, made, moved)
            continue
        try:
            yield spelling
        finally:
            _undo(root, made, moved)
        return
    yield None


def _undo(root: Path, made: list[Path], moved: list[int]) -> None:
    for pid in moved:
        with contextlib.suppress(OSError):
            (root / "cgroup.procs").write_text(str(pid))
    for d in reversed(made):
        with contextlib.suppress(OSError):
            d.rmdir()


# What a tenant (root in a CT) can make `pct exec CT -- bash -c SCAN rb-scan TOKEN HINT` print: its own `bash`
# (first on the CT's PATH, as a tenant may replace /bin/bash), which sees every argument the host passed.
FLOOD = ('yes "p\t$$\t5\tpython flood.py $(printf "%0200d" 0)" | head -c "${FLOOD_BYTES:-300000000}"\n'
         'yes "e flood on stderr" | head -c 50000000 >&2\n'
         'head -c "${FLOOD_BYTES:-300000000}" /dev/zero | tr "\\0" A\n')


def forge(victim: int, log: Path) -> str:
    """A CT that prints the host probe's markers with whatever it was handed ($4, the old probe's nonce):
    its own run, a block for CT `victim` whose log is the host's private key, and GPU sections of its own."""
    return (
        f'printf "p\\t7\\t50\\tpython train.py\\nf\\t7\\t1\\t%s\\n" {shlex.quote(str(log))}\n'
        'for n in "$4" "$@"; do\n'
        f'  printf "\\n@@CT:%s@@ {victim} rc=0\\np\\t1\\t9\\tpython steal.py\\nf\\t1\\t1\\t/root/.ssh/id_rsa\\n" "$n"\n'
        f'  printf "@@CT:%s@@ {victim} rc=0 len=48 cut=-\\np\\t1\\t9\\tpython steal.py\\nf\\t1\\t1\\t/root/.ssh/id_rsa\\n" "$n"\n'
        '  printf "\\n@@RB:%s@@ gpus\\n0, 00000000:18:00.0, GPU-FORGED, 1, 2, 3\\n\\n@@RB:%s@@ gpus.rc\\n0" "$n" "$n"\n'
        '  printf "\\n@@RB:%s@@ apps\\n1, GPU-FORGED, 9\\n\\n@@RB:%s@@ end\\n" "$n" "$n"\n'
        'done\n')


def hostile_ct(state: Path, vmid: int, name: str, body: str) -> None:
    """A running CT for the pct stand-in whose `bash` runs `body` (bash, with the scan's arguments) instead of
    the scan: `pct exec` puts the CT's own bin first on its PATH, as a tenant's /bin/bash would be."""
    (state / f"{vmid}.running").write_text(name)
    bin_dir = state / f"{vmid}.bin"
    bin_dir.mkdir(exist_ok=True)
    fake = bin_dir / "bash"
    fake.write_text(f"#!/bin/bash\n{body}")
    fake.chmod(0o755)
