"""A known GPU load for the utilisation-window capture (run_jobs.sh, `util`).

    python3 util_load.py --mode steady|duty --secs S [--busy 0.5 --idle 0.5] [--device cuda|cpu]

steady: back-to-back bf16 matmuls (8192^3), synchronised each round: the GPU never idles.
duty:   --busy seconds of the same matmuls, then --idle seconds asleep (50 % duty cycle).
Writes `busy t=...` / `idle t=...` edges to $JOB_EVENTS so the capture can line them up.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from events import event  # noqa: E402

import torch  # noqa: E402


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--mode", choices=["steady", "duty"], required=True)
    p.add_argument("--secs", type=float, default=17.0)
    p.add_argument("--busy", type=float, default=0.5)
    p.add_argument("--idle", type=float, default=0.5)
    p.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    a = p.parse_args()
    dev = torch.device(a.device)
    n = 8192 if a.device == "cuda" else 256
    dtype = torch.bfloat16 if a.device == "cuda" else torch.float32
    x = torch.randn(n, n, dtype=dtype, device=dev)
    w = torch.randn(n, n, dtype=dtype, device=dev) / n**0.5

    def sync() -> None:
        if a.device == "cuda":
            torch.cuda.synchronize()

    for _ in range(3):
        x = torch.tanh(x @ w)
    sync()
    event("ready")
    t_end = time.time() + a.secs
    rounds = 0
    while time.time() < t_end:
        t_busy = time.time() + (a.busy if a.mode == "duty" else 1e9)
        event("busy")
        while time.time() < min(t_busy, t_end):
            for _ in range(4):
                x = torch.tanh(x @ w)
            sync()
            rounds += 1
        if a.mode == "duty" and time.time() < t_end:
            event("idle")
            time.sleep(a.idle)
    event("done", rounds=rounds)
    print(f"util_load {a.mode}: {rounds} rounds", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
