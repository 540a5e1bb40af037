"""The demo's simulated training job: writes a realistic log through every phase (a child process).

Usage: python -m bot.demo.job PHASE_FILE SCALE [CUES]   (stdout and stderr go to the log, as in production)
It prints exactly what a real transformers run prints: nothing while importing, a device line,
a real tqdm `Loading weights` bar (frames separated by \\r, no newline until it closes), step
lines with tok/s, then silence, recovery, and a CUDA out-of-memory traceback. It records its
current phase in PHASE_FILE so the stand-in nvidia-smi can follow it. With a CUES folder (the cluster
demo's), it moves on to silence, recovery and the crash only once a file of that name is there: the demo
waits for the bot to see each phase, however slow this machine's SSH is.
"""

from __future__ import annotations

import math
import random
import sys
import time
from pathlib import Path

from tqdm import tqdm


class OutOfMemoryError(RuntimeError):
    """Prints as `torch.OutOfMemoryError`, like the real one."""


OutOfMemoryError.__module__ = "torch"


def main(phase_file: Path, scale: float, cues: Path | None = None) -> None:
    def phase(name: str, seconds: float) -> None:
        phase_file.write_text(name)
        time.sleep(seconds * scale)

    def until(cue: str, meanwhile) -> None:
        while cues is not None and not (cues / cue).exists():
            meanwhile()

    random.seed(7)
    phase("importing", 4)
    print("  Target 0 on cuda:0...", flush=True)
    phase_file.write_text("loading")
    tensors = 851
    for _ in tqdm(range(tensors), desc="Loading weights", mininterval=0.2, file=sys.stderr):
        time.sleep(7.0 * scale / tensors)
    phase_file.write_text("training")
    step, elapsed = 0, 0.0

    def steps(count: int) -> None:
        nonlocal step, elapsed
        for _ in range(count):
            step += 10
            elapsed += 0.6 * scale
            loss = 2.0 + 8.0 * math.exp(-step / 120) + random.uniform(-0.05, 0.05)
            rate = 14200 + random.randint(-150, 150)
            print(f"step={step} loss={loss:.4f} tok/s={rate} elapsed={elapsed:.1f}s", flush=True)
            time.sleep(0.6 * scale)

    steps(14)
    until("silence", lambda: steps(1))
    phase("silent", 9)  # hung: alive, no output, GPU memory held
    until("recover", lambda: time.sleep(0.05))
    phase_file.write_text("training")
    steps(8)
    until("crash", lambda: steps(1))
    phase_file.write_text("crashed")
    raise OutOfMemoryError(
        "CUDA out of memory. Tried to allocate 372.53 GiB. GPU 0 has a total capacity of 139.80 GiB "
        "of which 129.98 GiB is free."
    )


if __name__ == "__main__":
    main(Path(sys.argv[1]), float(sys.argv[2]), Path(sys.argv[3]) if len(sys.argv) > 3 else None)
