"""What a chart costs at its largest: one run, 24 h of points at one per 2 s (43,200 points), each metric.

The points have a loss curve with noise, a rate, two GPU roles (every 30th point, as probes carry
them), a restart, a few NaN / inf / 1e300 values, and three incidents. The first render in
a process also pays for importing matplotlib: that is timed on its own (`import`), the table is
the median of `--repeat` renders after it.

    .venv/bin/python bench/plot.py [--hours 24] [--every 2] [--repeat 3]

Prints a table and a last line `RESULT plot_24h_s=<slowest metric, seconds> ok=<it is under 1 s>`.
"""

from __future__ import annotations

import argparse
import math
import random
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bot.core.history import Point, RoleLoad  # noqa: E402
from bot.core.verdict import Phase  # noqa: E402
from bot.render.chart import METRICS, chart  # noqa: E402

NOW = 1_800_000_000.0


def history(hours: float, every: float) -> list[Point]:
    rng = random.Random(7)
    n = int(hours * 3600 / every)
    out, segment, step = [], 0, 0
    for i in range(n):
        t = NOW - hours * 3600 + i * every
        if i == n * 2 // 3:
            segment, step = 1, 0  # a relaunch
        step += 1
        loss = 2.0 + 6 * math.exp(-step / 3000) + rng.random() * 0.2
        if i % 5000 == 17:
            loss = rng.choice([math.nan, math.inf, 1e300])
        gpus = (RoleLoad("target", rng.choice((0.8, 0.9, 1.0)), 118.0 + rng.random()),
                RoleLoad("drafter", rng.random(), 40.0 + rng.random())) if i % 30 == 0 else ()
        out.append(Point(t, Phase.TRAINING, 0, step, 100_000, loss, 14_000 + rng.random() * 900, "tok/s", segment, gpus))
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--hours", type=float, default=24.0)
    ap.add_argument("--every", type=float, default=2.0, help="seconds between points")
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    points = history(args.hours, args.every)
    window = args.hours * 3600
    incidents = [NOW - window * f for f in (0.8, 0.5, 0.1)]

    started = time.perf_counter()
    chart("bench", points[:10], metric="loss", now=NOW, window=window)
    cold = time.perf_counter() - started

    rows = []
    for metric in METRICS:
        times, size = [], 0
        for _ in range(args.repeat):
            started = time.perf_counter()
            png = chart("bench", points, metric=metric, now=NOW, window=window, incidents=incidents)
            times.append(time.perf_counter() - started)
            size = len(png)
        assert png.startswith(b"\x89PNG\r\n\x1a\n")
        rows.append((metric, len(points), statistics.median(times), size))

    print(f"{'metric':<8} {'points':>8} {'seconds':>8} {'PNG KiB':>8}")
    print(f"{'import':<8} {'':>8} {cold:8.3f} {'':>8}  (first chart in a process: matplotlib loads)")
    for metric, n, seconds, size in rows:
        print(f"{metric:<8} {n:>8} {seconds:8.3f} {size / 1024:8.1f}")
    slowest = max(seconds for _, _, seconds, _ in rows)
    print(f"RESULT plot_24h_s={slowest:.3f} ok={slowest < 1.0}")


if __name__ == "__main__":
    main()
