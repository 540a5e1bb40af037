"""Does a probe's cost stay flat as the log grows? `runbot status` vs a full-file grep, on 1 MB / 100 MB / 2 GB logs
of step lines and on a 50 MB log that is one line of tqdm frames (a bar redrawn with `\r` and never a newline).

Usage: .venv/bin/python bench/probe_logsize.py [--sizes 1M,100M,2G,50M:bar] [--repeat 5] [--dir /tmp]
Prints a table and a last line `RESULT name=value ...`. Needs ~2 GB of free disk for the default sizes.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

UNITS = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
GREP = 'grep -E "tok/s|step=" "$1" | tail -3'


def parse_size(text: str) -> int:
    return int(float(text[:-1]) * UNITS[text[-1].upper()]) if text[-1].upper() in UNITS else int(text)


def build_log(path: Path, size: int) -> None:
    """A realistic log: mostly step lines, some warnings, ending mid-training."""
    lines = []
    for step in range(1, 2001):
        lines.append(f"step={step} loss={2 + 8 / step:.4f} tok/s={14200 + step % 97} elapsed={step * 0.8:.1f}s\n")
        if step % 50 == 0:
            lines.append("UserWarning: torch.utils.checkpoint: the use_reentrant parameter should be passed explicitly\n")
    block = "".join(lines).encode()
    with path.open("wb") as f:
        written = 0
        while written + len(block) <= size:
            f.write(block)
            written += len(block)
        f.write(block[: size - written])
        f.write(b"\nstep=999999 loss=2.0000 tok/s=14250 elapsed=1.0s\n")


def build_bar_log(path: Path, size: int) -> None:
    """Start-up lines, then one line of `\r`-separated tqdm frames of the loop's bar, `size` bytes in all."""
    total = 10_000_000
    with path.open("wb") as f:
        f.write(b"Loading checkpoint shards: 100%|##########| 4/4 [00:03<00:00,  1.10it/s]\n")
        written, n = 0, 0
        while written < size:
            n += 1
            frame = f"\r{n * 100 // total:3d}%|#         | {n}/{total} [1:02:03<9:00:00,  2.99it/s, loss=2.{n % 97:02d}]".encode()
            f.write(frame)
            written += len(frame)


def timed(cmd: list[str], env: dict, repeat: int) -> tuple[float, str]:
    times, out = [], ""
    for _ in range(repeat):
        start = time.perf_counter()
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
        times.append(time.perf_counter() - start)
        out = proc.stdout.splitlines()[0] if proc.stdout else proc.stderr.strip()
        if proc.returncode != 0:
            raise SystemExit(f"{cmd[:3]} failed ({proc.returncode}): {proc.stderr[-500:]}")
    return statistics.median(times), out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", default="1M,100M,2G,50M:bar")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--dir", default=None)
    args = ap.parse_args()
    rows = []
    with tempfile.TemporaryDirectory(prefix="runbot-bench-", dir=args.dir) as tmp:
        folder = Path(tmp)
        env = {**os.environ, "PATH": "/usr/bin:/bin"}  # no nvidia-smi: time the log work alone
        for label in args.sizes.split(","):
            log = folder / f"train-{label.replace(':', '-')}.log"
            size, _, shape = label.partition(":")
            (build_bar_log if shape == "bar" else build_log)(log, parse_size(size))
            config = folder / f"runs-{label.replace(':', '-')}.toml"
            config.write_text(f'[runs.bench]\nhost = "local"\nlog = "{log}"\ngpu_samples = 1\n')
            subprocess.run(["cat", str(log)], stdout=subprocess.DEVNULL, check=True)  # both start from a warm page cache
            status_s, verdict = timed([sys.executable, "-m", "bot", "--config", str(config), "status", "bench"], env, args.repeat)
            grep_s, _ = timed(["bash", "-c", GREP, "grep", str(log)], env, args.repeat)
            rows.append((label, log.stat().st_size, status_s, grep_s, verdict))
            log.unlink()
    print(f"{'log':>6} {'bytes':>12} {'status s':>9} {'grep s':>8} {'grep/status':>11}  verdict")
    for label, size, s, g, verdict in rows:
        print(f"{label:>6} {size:>12} {s:>9.3f} {g:>8.3f} {g / s:>10.1f}x  {verdict}")
    lines = [r for r in rows if ":" not in r[0]]
    small, big = lines[0], lines[-1]
    worst = max(rows, key=lambda r: r[2])  # the bar line included
    growth = worst[2] / small[2]
    speedup = big[3] / big[2]
    bar = next((r for r in rows if r[0].endswith(":bar")), None)
    print(f"RESULT status_small_s={small[2]:.3f} status_big_s={big[2]:.3f} "
          + (f"status_bar_s={bar[2]:.3f} " if bar else "")
          + f"growth={growth:.2f} grep_big_s={big[3]:.3f} speedup_vs_grep={speedup:.1f} "
          f"growth_ok={growth <= 1.5} speedup_ok={speedup >= 10}")


if __name__ == "__main__":
    main()
