"""What the parse costs per window: a probe's sections -> evidence -> verdict, pure CPU, no probe run.

Each real log of the corpora (tests/fixtures/public, tests/fixtures/heldout), cut to the probe's window (its
last 64 KiB), and a few built windows (step lines only, a bar's frames, a 64 KiB summary block), each read
`--repeat` times: `read_evidence` then `diagnose`, as `runbot status` does after the probe answers. Reports
the median per window and the sum over the corpus windows (the figure to compare before and after a change
to the grammar or the recognisers).

    .venv/bin/python bench/parse_cost.py [--repeat 5] [--only public]
Prints a table and a last line `RESULT name=value ...`.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bot.core.diagnose import diagnose  # noqa: E402
from bot.probe.replay import DefaultRun  # noqa: E402
from tests.builders import evidence  # noqa: E402

WINDOW = 64 * 1024


def built() -> dict[str, bytes]:
    steps = "".join(f"step={i} loss={2 + 8 / i:.4f} tok/s={14200 + i % 97} elapsed={i * 0.8:.1f}s\n" for i in range(1, 3000))
    bar = "".join(f"\r{n * 100 // 9000:3d}%|###       | {n}/9000 [1:02:03<9:00:00,  2.99it/s, loss=2.{n % 97:02d}]"
                  for n in range(1, 2000))
    summary = "".join(f"  Num examples = {i:,}\n  Total optimization steps = {i * 3:,}\n" for i in range(1, 2000))
    return {name: text.encode()[-WINDOW:] for name, text in
            (("built: step lines", steps), ("built: bar frames", bar), ("built: summary lines", summary))}


def corpus(only: str | None) -> dict[str, bytes]:
    out = {}
    for name in ("public", "heldout"):
        if only and name != only:
            continue
        for log in sorted((REPO / "tests" / "fixtures" / name).glob("*/log")):
            out[f"{name}/{log.parent.name}"] = log.read_bytes()[-WINDOW:]
    return out


def per_window(data: bytes, repeat: int) -> float:
    run = DefaultRun("bench", "/workspace/train.log")
    diagnose(evidence(data), run)  # warm the regex cache
    times = []
    for _ in range(repeat):
        started = time.process_time()
        diagnose(evidence(data), run)
        times.append(time.process_time() - started)
    return statistics.median(times)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--only", choices=("public", "heldout"), default=None)
    args = ap.parse_args()
    real = {name: per_window(data, args.repeat) for name, data in corpus(args.only).items()}
    made = {name: per_window(data, args.repeat) for name, data in built().items()}
    slowest = sorted(real.items(), key=lambda kv: -kv[1])[:5]
    print(f"{'window':<70} {'ms':>8}")
    for name, s in (*slowest, *made.items()):
        print(f"{name:<70} {s * 1000:>8.2f}")
    values = list(real.values())
    print(f"RESULT windows={len(values)} median_ms={statistics.median(values) * 1000:.2f} "
          f"mean_ms={statistics.mean(values) * 1000:.2f} total_ms={sum(values) * 1000:.1f} "
          f"max_ms={max(values) * 1000:.2f} " + " ".join(f"{n.split(': ')[1].replace(' ', '_')}_ms={s * 1000:.2f}"
                                                         for n, s in made.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
