"""Pure: is anything still writing the log? (seen, gone, not visible to the probe, writing another file)."""

from __future__ import annotations

import enum
import re
from collections.abc import Sequence
from dataclasses import dataclass

from bot.core.evidence import Evidence
from bot.core.facts import FolderUse, Process

TRAINING_PROCESS = re.compile(r"python|torchrun|deepspeed|accelerate|lightning|\bmpirun\b|\bsrun\b")


class Life(str, enum.Enum):
    ALIVE = "alive"  # a process holds the log open for writing
    GONE = "gone"  # the probe saw every process's files, and none writes the log
    UNSEEN = "unseen"  # no writer seen, but the probe was not allowed to see every process's files
    MOVED = "moved"  # nobody writes the log, but a process writes another file of its folder (rotated away)
    NEAR = "near"  # nobody holds the log open, but a training process works in its folder: it opens the log per write
    PAUSED = "paused"  # the writer is there but stopped (SIGSTOP, Ctrl-Z in tmux, a debugger): it runs no code


@dataclass(frozen=True)
class Liveness:
    life: Life
    writer: Process | None = None

    @property
    def alive(self) -> bool:
        return self.life is not Life.GONE


def main_writer(writers: Sequence[Process]) -> Process | None:
    """The training process among the log's writers (a `tee`, a launcher or Open MPI's daemon may hold it too)."""
    if not writers:
        return None
    training = [p for p in writers if TRAINING_PROCESS.search(p.command) and "<defunct>" not in p.command]
    return max(training or writers, key=lambda p: p.elapsed_s or 0)


def liveness(ev: Evidence) -> Liveness:
    writer = main_writer(ev.writers)
    if writer is not None:
        return Liveness(Life.PAUSED if writer.paused else Life.ALIVE, writer)
    if ev.moved is not None:
        return Liveness(Life.MOVED, ev.moved.process)
    if near := main_writer([p for p in ev.near if TRAINING_PROCESS.search(p.command) and could_write(ev, p)]):
        # `with open(log, "a") as f: f.write(...)` each step (nanoGPT-style loops) holds nothing open
        # between writes; its process, working in the log's folder, is the run.
        return Liveness(Life.PAUSED if near.paused else Life.NEAR, near)
    # A log written seconds ago with no writer seen is not alive when the probe saw every process:
    # a killed compile must not read "compiling — 7 s so far".
    return Liveness(Life.UNSEEN if ev.hidden_processes else Life.GONE)


# ps's etimes and the log's mtime are whole seconds: a process counts as started after the last write only past this.
_CLOCK_SLACK_S = 2.0


def could_write(ev: Evidence, p: Process) -> bool:
    """Whether a process working in the log's folder may be the loop that opens the log for each write. Not one
    that started after the log's last write (a job started there since, a shell), nor one whose whole tree only
    reads files there and holds no GPU: a TensorBoard (its data server holds the event files read-only)."""
    if ev.now is not None and ev.log.mtime is not None and p.elapsed_s is not None:
        if ev.now - p.elapsed_s - ev.log.mtime > _CLOCK_SLACK_S:
            return False
    tree = _tree(ev.near_use, p.pid)
    return not tree or any(u.writes or u.gpu for u in tree) or not any(u.reads for u in tree)


def _tree(uses: Sequence[FolderUse], pid: int) -> list[FolderUse]:
    """The process's own use and its descendants' among those working in the folder."""
    seen, todo = {pid}, [pid]
    while todo:
        here = todo.pop()
        for u in uses:
            if u.ppid == here and u.pid not in seen:
                seen.add(u.pid)
                todo.append(u.pid)
    return [u for u in uses if u.pid in seen]
