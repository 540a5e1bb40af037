"""On a real GPU: what the driver's own utilisation window says under known loads, and what it costs to ask.

Runs three loads one after another on GPU 0 — a steady matmul, a 50 % duty cycle (0.5 s on, 0.5 s off),
and nothing — waits for the driver's sample buffer to fill with each, then keeps the raw output of
`nvidia-smi -q -d UTILIZATION`, `--query-gpu` and `--query-compute-apps` (and the load's /proc/PID/cgroup)
as fixtures, and times each call. Needs PyTorch and a GPU (the device machine); writes into OUT.

Usage: python3 bench/gpu_window.py OUT_DIR
Prints a table and a last line `RESULT name=value ...`.

Measured on the H200 (driver 580.159.04, 2026-12-01; the captures in tests/fixtures/gpu-utilization/):
`-q -d UTILIZATION` 37–45 ms a call, `--query-gpu` 26 ms; steady 99/98/98, duty50 99/0/49, idle 0/0/0
(Max/Min/Avg), each 71 samples over 14.00 s. The probe now makes those two calls instead of five readings
spread over a second (issue 12: 0.92 s a probe there). Not yet timed end to end on the GPU machine.

The probe's own cost with the tests' stand-in nvidia-smi (tests/standins.py), on the 2-core development
machine, median of 30 local probes of a small log (`build_script` + `LocalRunner`, 2026-12-01):

| probe | gpu_samples = 5 | gpu_samples = 1 |
| --- | ---: | ---: |
| before issue 12 (five readings, sleeps between) | 805 ms | 34 ms |
| driver's window (one -q, one reading, no sleep) | 29 ms | 30 ms |
| window N/A: fallback to readings | 815 ms | 26–51 ms |

The stand-in answers in a few ms, so these are bash's own costs: the fallback pays the old sampling plus
one `-q` call and an awk check; the window path pays no sleep at all.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

LOAD = r"""
import sys, time, torch
duty = float(sys.argv[1])
a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
print("ready", flush=True)
while True:
    start = time.time()
    while time.time() - start < duty:
        for _ in range(4):
            a @ a
        torch.cuda.synchronize()
    if duty < 1.0:
        time.sleep(1.0 - duty)
"""
LOADS = (("steady", 1.0), ("duty50", 0.5), ("idle", None))  # (name, share of each second spent computing)


@contextlib.contextmanager
def gpu_load(duty: float | None) -> Iterator[subprocess.Popen | None]:
    """A matmul loop on GPU 0 busy `duty` of each second (None: nothing runs), until the block ends."""
    if duty is None:
        yield None
        return
    proc = subprocess.Popen([sys.executable, "-c", LOAD, str(duty)], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
        yield proc
    finally:
        proc.kill()
        proc.wait()


QUERY_GPU = ["nvidia-smi", "--query-gpu=index,pci.bus_id,uuid,memory.used,memory.total,utilization.gpu",
             "--format=csv,noheader,nounits"]
QUERY_APPS = ["nvidia-smi", "--query-compute-apps=pid,gpu_uuid,used_memory", "--format=csv,noheader,nounits"]
UTILIZATION = ["nvidia-smi", "-q", "-d", "UTILIZATION"]


def timed(cmd: list[str], n: int = 10) -> tuple[str, float]:
    """The output of one call and the median wall time of n."""
    times, out = [], ""
    for _ in range(n):
        t = time.perf_counter()
        out = subprocess.run(cmd, capture_output=True, text=True, check=False).stdout
        times.append(time.perf_counter() - t)
    return out, sorted(times)[n // 2]


def main() -> None:
    out = Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    rows = []
    for name, duty in LOADS:
        with gpu_load(duty) as proc:
            time.sleep(16)  # the driver's window is about 14 s: fill it with this load alone
            util, util_s = timed(UTILIZATION)
            query, query_s = timed(QUERY_GPU)
            apps, _ = timed(QUERY_APPS, 1)
            (out / f"{name}.utilization.txt").write_text(util)
            (out / f"{name}.query-gpu.csv").write_text(query + (apps and "# --query-compute-apps\n" + apps))
            if proc is not None:
                (out / f"{name}.cgroup.txt").write_text(Path(f"/proc/{proc.pid}/cgroup").read_text())
        block = util.split("GPU Utilization Samples")[-1].split("Memory Utilization Samples")[0]
        values = {k.strip(): v.strip() for k, _, v in (line.partition(":") for line in block.splitlines()) if v}
        rows.append((name, values.get("Max", "?"), values.get("Min", "?"), values.get("Avg", "?"),
                     values.get("Number of Samples", "?"), values.get("Duration", "?"), util_s, query_s))
        time.sleep(2)
    print(f"{'load':<8} {'max':>6} {'min':>6} {'avg':>6} {'samples':>8} {'duration':>10} {'-q ms':>7} {'query ms':>9}")
    for name, mx, mn, avg, n, dur, util_s, query_s in rows:
        print(f"{name:<8} {mx:>6} {mn:>6} {avg:>6} {n:>8} {dur:>10} {util_s * 1000:>7.1f} {query_s * 1000:>9.1f}")
    parts = " ".join(f"{r[0]}_avg={r[3].replace(' ', '')} {r[0]}_min={r[2].replace(' ', '')} {r[0]}_max={r[1].replace(' ', '')}"
                     for r in rows)
    print(f"RESULT {parts} window_ms={rows[0][6] * 1000:.1f} query_ms={rows[0][7] * 1000:.1f} driver="
          + subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"], capture_output=True,
                           text=True).stdout.strip().replace(" ", ""))


if __name__ == "__main__":
    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
    main()
