"""The watchdog at scale: 500 local runs swept every 10 s for two minutes — sweep time, CPU, memory, and where the CPU goes.

Each run has its own 256 KiB log; one helper process holds every log open for writing and appends a
step line to each every few seconds (so runs are healthy and have a writer, as in production), and a
handful of runs fall silent or crash so the alert path runs too. Messages go to a counting chat (no
Slack). gpu_samples = 1 with no nvidia-smi on PATH. Sweeps run back to back on the check_every
cadence, as the scheduler's coalescing interval job would; each sweep is timed from start to its last
probe. Then the probe script's own cost is taken apart, section by section.

    .venv/bin/python bench/watchdog.py [--runs 500] [--every 10] [--seconds 120] [--log-kib 256]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bot.probe.script import _BODY, build_script
from bot.service.state_file import StateFile
from bot.probe.targets import Targets
from bot.service.watchdog import Watchdog
from config.registry import parse_registry

WRITER = r"""
import sys, time
files = [open(p, "a", buffering=1) for i, p in enumerate(sys.argv[2:]) if i % 100 != 2]  # those crashed: no writer
every, step = float(sys.argv[1]), 0
while True:
    step += 1
    for i, f in enumerate(files):
        if i % 100 == 1:
            continue  # alive and silent
        f.write(f"step={step} loss=2.01 tok/s=14200 elapsed={step * every:.1f}s\n")
    time.sleep(every)
"""
CRASH = "Traceback (most recent call last):\n  File \"train.py\", line 9\ntorch.OutOfMemoryError: CUDA out of memory.\n"


class CountingChat:
    def __init__(self) -> None:
        self.posts = self.updates = 0

    async def post(self, channel, text, blocks, thread_ts=None, *, key=None):
        self.posts += 1
        return f"{self.posts}.0001"

    async def update(self, channel, ts, text, blocks):
        self.updates += 1


def cpu(who: int) -> float:
    r = resource.getrusage(who)
    return r.ru_utime + r.ru_stime


def make_runs(folder: Path, n: int, log_kib: int) -> tuple[Path, list[Path]]:
    block = "".join(f"step={i} loss=2.{i % 97:02d} tok/s=14200 elapsed={i * 0.8:.1f}s\n" for i in range(1, 400)).encode()
    logs, runs = [], []
    for i in range(n):
        log = folder / f"run{i:03d}.log"
        log.write_bytes((block * (log_kib * 1024 // len(block) + 1))[: log_kib * 1024] + b"\n" + (CRASH.encode() if i % 100 == 2 else b""))
        logs.append(log)
        runs.append(f'[runs.run{i:03d}]\nhost = "local"\nlog = "{log.name}"\n')
    config = folder / "runs.toml"
    config.write_text('[bot]\ncheck_every = "10s"\nalert_channel = "C0BENCH"\nstate_db = "state.sqlite3"\n\n'
                      '[defaults]\ngpu_samples = 1\nsilence_after = "30s"\n\n' + "\n".join(runs))
    return config, logs


def section_costs(log: Path, repeat: int = 40) -> list[tuple[str, float]]:
    """CPU ms of each probe section, run `repeat` times in one bash (the definitions only, then calls)."""
    class Run:
        step_pattern, gpu_samples = None, 1
    Run.log = str(log)
    head = build_script(Run(), "abcdef0123456789").split(_BODY)[0]
    defs = _BODY.split("exec 4< <(gpu_rounds)")[0]
    out = []
    for name, call in (("bash start (bash -c true)", None), ("meta", "part meta meta"), ("window", "part window window"),
                       ("steps", "part steps steps"), ("writers (/proc/*/fd scan)", "part writers writers"),
                       ("procs (ps | awk | grep)", "part procs procs"), ("gpu_rounds (no nvidia-smi)", "gpu_rounds"),
                       ("whole probe", None)):
        if name.startswith("bash start"):
            script = "true"
        elif name == "whole probe":
            script = head + _BODY
        else:
            script = head + defs + f"for ((k = 0; k < {repeat}; k++)); do {call}; done"
        before = cpu(resource.RUSAGE_CHILDREN)
        runs = repeat if call is None else 1
        for _ in range(runs):
            subprocess.run(["bash", "-c", script], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False)
        out.append((name, (cpu(resource.RUSAGE_CHILDREN) - before) / repeat * 1000))
    return out


async def bench(args) -> dict:
    with tempfile.TemporaryDirectory(prefix="runbot-bench-wd-") as tmp:
        folder = Path(tmp)
        config, logs = make_runs(folder, args.runs, args.log_kib)
        writer = subprocess.Popen([sys.executable, "-c", WRITER, "3", *map(str, logs)])  # noqa: ASYNC220 - started once, before the clock runs
        try:
            await asyncio.sleep(1.0)
            registry = parse_registry(config.read_text(), config)
            chat = CountingChat()
            store = StateFile.open(registry.bot.state_db)
            wd = Watchdog(registry, Targets(registry), store, chat)
            judged = [0.0]
            judge = wd.judge

            def timed_judge(run, verdict):  # decide + render + commit: the watchdog's own share
                t = time.thread_time()
                try:
                    return judge(run, verdict)
                finally:
                    judged[0] += time.thread_time() - t

            wd.judge = timed_judge
            lags: list[float] = []
            lag_task = asyncio.create_task(loop_lag(lags))
            sweeps, started = [], time.monotonic()
            self0, kids0 = cpu(resource.RUSAGE_SELF), cpu(resource.RUSAGE_CHILDREN)
            next_at = started
            while time.monotonic() - started < args.seconds:
                await asyncio.sleep(max(0.0, next_at - time.monotonic()))
                t = time.monotonic()
                report = await wd.sweep()
                sweeps.append(report.seconds)
                next_at = max(t + args.every, time.monotonic())  # coalesced: a late sweep is not run twice
            wall = time.monotonic() - started
            self_cpu, kids_cpu = cpu(resource.RUSAGE_SELF) - self0, cpu(resource.RUSAGE_CHILDREN) - kids0
            statuses = {}
            for state in wd.states.values():
                statuses[state.status.value] = statuses.get(state.status.value, 0) + 1
            lag_task.cancel()
            await wd.stop()
            store.close()
            costs = await asyncio.to_thread(section_costs, logs[0])
        finally:
            writer.kill()
            writer.wait()
    return {"sweeps": sweeps, "wall": wall, "self_cpu": self_cpu, "kids_cpu": kids_cpu, "costs": costs,
            "posts": chat.posts, "judge_s": judged[0], "lags": lags, "updates": chat.updates, "statuses": statuses,
            "rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}


async def loop_lag(out: list[float], tick: float = 0.05) -> None:
    """How late the event loop wakes a 50 ms sleeper: what a Slack ack would wait during sweeps."""
    while True:
        t = time.perf_counter()
        await asyncio.sleep(tick)
        out.append(time.perf_counter() - t - tick)


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=500)
    ap.add_argument("--every", type=float, default=10.0)
    ap.add_argument("--seconds", type=float, default=120.0)
    ap.add_argument("--log-kib", type=int, default=256)
    args = ap.parse_args()
    r = asyncio.run(bench(args))
    sweeps = r["sweeps"]
    p50, p99 = statistics.median(sweeps), pct(sweeps, 0.99)
    bot_share, probe_share = r["self_cpu"] / r["wall"], r["kids_cpu"] / r["wall"]
    print(f"watchdog: {args.runs} local runs, every {args.every:g} s, for {r['wall']:.0f} s, {os.cpu_count()} CPUs, "
          f"logs {args.log_kib} KiB, gpu_samples 1, no nvidia-smi")
    print(f"sweeps: {len(sweeps)} · p50 {p50:.2f} s · p99 {p99:.2f} s · all: {' '.join(f'{s:.1f}' for s in sweeps)}")
    print(f"CPU, share of one core: bot process {bot_share:.1%} · probes (bash and its children) {probe_share:.1%}")
    print(f"per run per sweep: bot {r['self_cpu'] / len(sweeps) / args.runs * 1000:.1f} ms · "
          f"probe {r['kids_cpu'] / len(sweeps) / args.runs * 1000:.1f} ms CPU")
    print(f"of which decide + render + commit (bot/alerts, render_alerts, store): "
          f"{r['judge_s'] / len(sweeps) / args.runs * 1000:.2f} ms per run per sweep")
    print(f"event-loop lag (a 50 ms sleeper, what a Slack ack waits): p50 {statistics.median(r['lags']) * 1000:.0f} ms · "
          f"p99 {pct(r['lags'], 0.99) * 1000:.0f} ms · max {max(r['lags']) * 1000:.0f} ms")
    print(f"peak RSS {r['rss_mb']:.0f} MB · messages: {r['posts']} posts, {r['updates']} edits · states {r['statuses']}")
    print("probe CPU by section (ms per call, one bash each for 'bash start' and 'whole probe'):")
    for name, ms in r["costs"]:
        print(f"  {name:34} {ms:6.1f}")
    ok = p50 < 5 and bot_share < 0.10
    print(f"target: sweep < 5 s and < 10% of one core: {'PASS' if ok else 'FAIL'} "
          f"(the bot itself: {bot_share:.1%}; with its probes: {bot_share + probe_share:.1%})")
    costs = {name.split()[0]: ms for name, ms in r["costs"]}
    print(f"RESULT runs={args.runs} every_s={args.every:g} sweeps={len(sweeps)} sweep_p50_s={p50:.2f} sweep_p99_s={p99:.2f} "
          f"bot_cpu_pct={bot_share * 100:.1f} probe_cpu_pct={probe_share * 100:.1f} rss_mb={r['rss_mb']:.0f} "
          f"judge_ms={r['judge_s'] / len(sweeps) / args.runs * 1000:.2f} loop_lag_p99_ms={pct(r['lags'], 0.99) * 1000:.0f} "
          f"probe_ms={costs['whole']:.1f} bash_start_ms={costs['bash']:.1f} posts={r['posts']} cpus={os.cpu_count()}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
