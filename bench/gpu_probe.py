"""On a real GPU: the probe with the driver's utilisation window against the probe that samples, and both
against a 10 Hz reference sampler over the same 14 s, under known loads.

For each load on GPU 0 — a steady matmul, a 50 % duty cycle (0.5 s on, 0.5 s off), nothing — the reference
(`nvidia-smi --query-gpu=utilization.gpu -lms 100`) runs for 14 s while the load runs, then runbot's probe
of a run on this machine runs --n times with the driver's window and --n times without it (a stand-in
nvidia-smi that answers `-q` with "not supported" and passes everything else to the real one: the probe
falls back to `gpu_samples` readings, as before). Classes: runbot's own, from each probe's verdict; the
reference's from its 140 readings by the readings rule. Needs PyTorch and a GPU (the device machine).

Usage: python3 bench/gpu_probe.py [--n 5] [--gpu-samples 5]
Prints a table and a last line `RESULT name=value ...`.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.gpu_window import LOADS, gpu_load  # noqa: E402
from bot.core.facts import GpuReadings, GpuSample  # noqa: E402
from bot.core.gpus import classify  # noqa: E402
from bot.probe.checkup import verdict_from_output  # noqa: E402
from bot.probe.replay import DefaultRun  # noqa: E402
from bot.probe.runners import LocalRunner  # noqa: E402
from bot.probe.script import build_script  # noqa: E402

NONCE = "abcdef0123456789"
NO_WINDOW = """#!/usr/bin/env bash
for a in "$@"; do [ "$a" = "-q" ] && { echo "Utilization samples are not supported on this GPU" >&2; exit 2; }; done
exec {real} "$@"
"""


def reference(seconds: float = 14.0) -> list[float]:
    """10 readings a second of GPU 0's utilisation, for `seconds`."""
    proc = subprocess.Popen(["nvidia-smi", "--id=0", "--query-gpu=utilization.gpu", "--format=csv,noheader,nounits",
                             "-lms", "100"], stdout=subprocess.PIPE, text=True)
    time.sleep(seconds)
    proc.terminate()
    out, _ = proc.communicate()
    return [float(x) for x in out.split() if x.strip().replace(".", "").isdigit()]


def reference_class(utils: list[float]) -> str:
    readings = GpuReadings(samples=tuple((GpuSample(0, u, 1000.0, 143771.0),) for u in utils))
    return classify(readings).gpus[0].cls


def probes(run: DefaultRun, env: dict, n: int) -> tuple[list[float], list[str], str]:
    walls, classes, basis = [], [], ""
    for _ in range(n):
        t = time.perf_counter()
        result = asyncio.run(LocalRunner(env).run(build_script(run, NONCE), timeout=30))
        walls.append(time.perf_counter() - t)
        verdict = verdict_from_output(run, result, NONCE)
        classes.append(verdict.gpu.gpus[0].cls if verdict.gpu and verdict.gpu.gpus else "none")
        basis = verdict.gpu.basis.method.name.lower() if verdict.gpu and verdict.gpu.basis else "?"
    return walls, classes, basis


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=5)
    ap.add_argument("--gpu-samples", type=int, default=5)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="runbot-gpu-probe-") as tmp:
        folder = Path(tmp)
        log = folder / "train.log"
        log.write_text("".join(f"step={i} loss=2.0 tok/s=14200\n" for i in range(1, 200)))
        run = DefaultRun("gpu", log=str(log), gpu_samples=args.gpu_samples)
        fallback_bin = folder / "bin"
        fallback_bin.mkdir()
        (fallback_bin / "nvidia-smi").write_text(NO_WINDOW.replace("{real}", shutil.which("nvidia-smi") or "nvidia-smi"))
        (fallback_bin / "nvidia-smi").chmod(0o755)
        window_env = {"PATH": os.environ["PATH"]}
        fallback_env = {"PATH": f"{fallback_bin}:{os.environ['PATH']}"}
        rows = []
        for name, duty in LOADS:
            with gpu_load(duty):
                ref = reference()  # the driver's window now covers the same 14 s of this load
                new_walls, new_classes, new_basis = probes(run, window_env, args.n)
                old_walls, old_classes, old_basis = probes(run, fallback_env, args.n)
            rows.append((name, reference_class(ref), len(ref), min(ref), statistics.mean(ref), max(ref),
                         statistics.median(new_walls), new_classes, new_basis,
                         statistics.median(old_walls), old_classes, old_basis))
            time.sleep(3)
    print(f"{'load':<7} {'reference (10 Hz)':<30} {'window probe':<34} {'sampling probe (gpu_samples ' + str(args.gpu_samples) + ')':<40}")
    agree_new = agree_old = 0
    for name, ref_cls, n, lo, avg, hi, new_s, new_c, new_b, old_s, old_c, old_b in rows:
        agree_new += all(c == ref_cls for c in new_c)
        agree_old += all(c == ref_cls for c in old_c)
        print(f"{name:<7} {ref_cls:<11} {n:>3} min {lo:>3.0f} avg {avg:>3.0f} max {hi:>3.0f}  "
              f"{new_s * 1000:>6.0f} ms {new_b:<8} {','.join(sorted(set(new_c))):<14}  "
              f"{old_s * 1000:>6.0f} ms {old_b:<8} {','.join(sorted(set(old_c))):<14}")
    new_p50 = statistics.median(r[6] for r in rows)
    old_p50 = statistics.median(r[9] for r in rows)
    print(f"RESULT window_probe_ms={new_p50 * 1000:.0f} sampling_probe_ms={old_p50 * 1000:.0f} "
          f"window_agrees={agree_new}/{len(rows)} sampling_agrees={agree_old}/{len(rows)} gpu_samples={args.gpu_samples} "
          f"goal_ok={new_p50 <= 0.15}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
