"""The scaling table: bench/watchdog.py for local fleets of 100, 500, 1000 and 2000 runs, one table of their RESULT lines.

Each size is its own subprocess of bench/watchdog.py (`--ssh-runs 0`, `--silence-after 10m` as in production,
logs of 256 KiB growing every 3 s, 50 `/run status` at once during each sweep after the first), run one after
the other for `--seconds` each, so a user can see how sweep time, CPU, memory and the answer to a question
grow with the fleet, and where one bot stops being enough: a sweep longer than check_every (it is cut at 9 s,
90 % of it, and the runs it did not reach are carried into the next) or a question's p99 past 1 s.

The machine these figures come from is a loaded 2-core box shared with other work: the load average is
printed with the table, and a short `--seconds` means few sweeps, mostly the first look at every run.

    .venv/bin/python bench/scaling.py [--sizes 100,500,1000,2000] [--seconds 60]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

WATCHDOG = Path(__file__).resolve().parent / "watchdog.py"
# (RESULT key, column heading, unit) in the order the table shows them.
COLUMNS = (("runs", "runs", ""), ("sweep_p50_s", "sweep p50", " s"), ("looked_p50", "probed/sweep p50", ""),
           ("carried_max", "carried max", ""), ("bot_cpu_pct", "bot CPU", " %"), ("probe_cpu_pct", "probes CPU", " %"),
           ("rss_mb", "peak RSS", " MB"), ("ask_p99_ms", "question p99", " ms"),
           ("loop_lag_p99_ms", "loop lag p99", " ms"))


def result_line(stdout: str) -> dict[str, str]:
    """The key=value pairs of the last `RESULT` line in a bench's output ({} if it printed none)."""
    lines = [line for line in stdout.splitlines() if line.startswith("RESULT ")]
    if not lines:
        return {}
    return dict(pair.split("=", 1) for pair in lines[-1].split()[1:] if "=" in pair)


def measure(size: int, seconds: float, every: float) -> dict[str, str]:
    """One bench/watchdog.py run of `size` local runs; its RESULT pairs, or {"error": ...} when it printed none."""
    cmd = [sys.executable, str(WATCHDOG), "--runs", str(size), "--ssh-runs", "0", "--silence-after", "10m",
           "--seconds", f"{seconds:g}", "--every", f"{every:g}"]
    # watchdog.py exits 1 when its targets are missed: that is a figure for the table, not a failure here.
    done = subprocess.run(cmd, capture_output=True, text=True, check=False)
    found = result_line(done.stdout)
    if not found:
        tail = (done.stderr or done.stdout).strip().splitlines()[-1:] or ["no output"]
        return {"runs": str(size), "error": f"exit {done.returncode}: {tail[0][:120]}"}
    return found


def table(rows: list[dict[str, str]]) -> list[str]:
    """A markdown table, one row a fleet size."""
    out = ["| " + " | ".join(head for _, head, _ in COLUMNS) + " |", "|" + " --- |" * len(COLUMNS)]
    for row in rows:
        if "error" in row:
            out.append(f"| {row['runs']} | {row['error']} |" + " |" * (len(COLUMNS) - 2))
            continue
        out.append("| " + " | ".join(f"{row.get(key, '?')}{unit}" for key, _, unit in COLUMNS) + " |")
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="100,500,1000,2000", help="local fleet sizes, comma separated")
    ap.add_argument("--seconds", type=float, default=60.0, help="seconds of sweeps per size")
    ap.add_argument("--every", type=float, default=10.0, help="check_every in seconds")
    args = ap.parse_args()
    sizes = [int(s) for s in args.sizes.split(",") if s.strip()]
    load_before = os.getloadavg()
    rows = []
    for size in sizes:
        rows.append(measure(size, args.seconds, args.every))
        print(f"{size} runs done: {' '.join(f'{k}={v}' for k, v in rows[-1].items())}", file=sys.stderr, flush=True)
    load_after = os.getloadavg()
    print(f"scaling: local runs, silence_after 10m, check_every {args.every:g} s, {args.seconds:g} s each, "
          f"{os.cpu_count()} CPUs; load average (1/5/15 min) before {' '.join(f'{x:.2f}' for x in load_before)}, "
          f"after {' '.join(f'{x:.2f}' for x in load_after)}")
    print("\n".join(table(rows)))
    good = [r for r in rows if "error" not in r]
    print("RESULT name=scaling " + " ".join(
        f"r{r['runs']}_sweep_p50_s={r['sweep_p50_s']} r{r['runs']}_bot_cpu_pct={r['bot_cpu_pct']} "
        f"r{r['runs']}_probe_cpu_pct={r['probe_cpu_pct']} r{r['runs']}_rss_mb={r['rss_mb']} "
        f"r{r['runs']}_ask_p99_ms={r['ask_p99_ms']} r{r['runs']}_loop_lag_p99_ms={r['loop_lag_p99_ms']}"
        for r in good) + f" errors={len(rows) - len(good)} load1={load_after[0]:.2f} cpus={os.cpu_count()}")
    return 0 if len(good) == len(rows) else 1


if __name__ == "__main__":
    sys.exit(main())
