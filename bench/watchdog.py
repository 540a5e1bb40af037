"""The watchdog at scale: 500 local runs and 500 runs in 50 CTs on 5 loopback sshd hosts, swept every 10 s for
two minutes — sweep time, CPU, memory, the event loop's lag while 50 `/run status` arrive during a sweep, and
where the probe's CPU goes.

Each run has its own 256 KiB log; one helper process holds every log open for writing and appends a
step line to each every few seconds (so runs are healthy and have a writer, as in production), and a
handful of runs fall silent or crash so the alert path runs too. SSH runs go through real sshds
(tests/sshd.py) and the `pct` stand-in; their logs are on this machine like the local ones. Messages go
to a counting chat (no Slack). gpu_samples = 1 with no nvidia-smi on PATH. Sweeps run back to back on
the check_every cadence, as the scheduler's coalescing interval job would; each sweep is timed from start
to its last probe, or cut at 90 % of check_every as the scheduled job cuts it (its runs not reached go first
next sweep). Each run is probed when its look is due (bot.core.cadence): with `--silence-after 30s` every
sweep, with "10m" a steady run every 150 s. From the second sweep on, 50 questions about 50 runs (the Slack
app's path through the one scheduler) arrive 0.2 s into the sweep, all at once or one every
`--ask-spread / asks` seconds; about the next runs along each sweep, or with `--ask-same` the same runs every
sweep. The probes' CPU is this process's children's and, for SSH runs, the sshd servers' trees'. Then the probe script's own cost is taken apart.

    .venv/bin/python bench/watchdog.py [--runs 500] [--ssh-runs 500] [--hosts 5] [--cts 50] [--asks 50]
                                       [--every 10] [--seconds 120] [--log-kib 256] [--silence-after 30s]
                                       [--ask-spread 0] [--ask-same] [--settle 0]
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

from bot.probe.replay import DefaultRun
from bot.probe.scheduler import Priority
from bot.probe.script import _BODY, build_script
from bot.service.state_file import StateFile
from bot.probe.targets import Targets
from bot.service.watchdog import Watchdog
from config.registry import parse_registry
from tests.sshd import SshLab

WRITER = r"""
import resource, sys, time
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, max(soft, len(sys.argv) + 64)), hard))
files = [open(p, "a", buffering=1) for i, p in enumerate(sys.argv[2:]) if i % 100 != 2]  # those crashed: no writer
every, step = float(sys.argv[1]), 10 ** 6  # after the steps already in the logs
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


def make_runs(folder: Path, n: int, log_kib: int, ssh: list | None = None, ssh_runs: int = 0,
              cts: int = 1, silence_after: str = "30s") -> tuple[Path, list[Path]]:
    """n local runs, and ssh_runs spread over the sshds in `ssh` and `cts` containers in all (CT 100 + k)."""
    # A training log: the step counter only goes up (a log whose counter starts over every few hundred lines
    # reads as restarts, and costs the parser a second pass).
    lines, size, k = [], 0, 0
    while size < log_kib * 1024:
        k += 1
        lines.append(f"step={k} loss=2.{k % 97:02d} tok/s=14200 elapsed={k * 0.8:.1f}s\n")
        size += len(lines[-1])
    body = "".join(lines).encode()[: log_kib * 1024]
    logs, runs, hosts = [], [], []
    for i in range(n + ssh_runs):
        log = folder / f"run{i:04d}.log"
        log.write_bytes(body + b"\n" + (CRASH.encode() if i % 100 == 2 else b""))
        logs.append(log)
        if i < n:
            runs.append(f'[runs.run{i:04d}]\nhost = "local"\nlog = "{log.name}"\n')
        else:
            k = (i - n) % cts  # the k-th container, on host k % len(ssh)
            srv = ssh[k % len(ssh)]
            srv.set_ct(100 + k, "running", name=f"train{k}")
            runs.append(f'[runs.run{i:04d}]\nhost = "{srv.name}"\ncontainer = {100 + k}\nlog = "{log}"\n')
    for srv in ssh or []:
        target = srv.target()
        hosts.append(f'[hosts.{srv.name}]\naddress = "127.0.0.1"\nport = {srv.port}\nuser = "{target.user}"\n'
                     f'key = "{target.key}"\nknown_hosts = "{target.known_hosts}"\nconnect_timeout = "5s"\n')
    config = folder / "runs.toml"
    config.write_text('[bot]\ncheck_every = "10s"\nalert_channel = "C0BENCH"\nstate_db = "state.sqlite3"\n\n'
                      + "\n".join(hosts) + f'\n[defaults]\ngpu_samples = 1\nsilence_after = "{silence_after}"\n\n'
                      + "\n".join(runs))
    return config, logs


def section_costs(log: Path, repeat: int = 40) -> list[tuple[str, float]]:
    """CPU ms of each probe section, run `repeat` times in one bash (the definitions only, then calls)."""
    head = build_script(DefaultRun("bench", log=str(log)), "abcdef0123456789").split(_BODY)[0]
    defs = _BODY.split("exec 4< <(gpu_rounds)")[0]
    out = []
    defs += 'LOG=${LOGS[0]}; STEP_ERE=${STEP_ERES[0]}; R=0; look; scan >/dev/null\n'  # one run's values, as the loop sets them
    for name, call in (("bash start (bash -c true)", None), ("look (stat: all a quiet log costs)", "look"),
                       ("meta", "part meta meta"), ("window", "part window window"),
                       ("steps", "part steps steps"), ("scan (/proc/*/fd, once a probe)", "scan"),
                       ("writers (from the scan)", "part writers writers"),
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
        lab = SshLab(folder / "lab") if args.ssh_runs else None
        try:
            servers = [lab.sshd(f"pve{i + 1}") for i in range(args.hosts)] if lab else []
            return await _bench(args, folder, servers)
        finally:
            if lab is not None:
                lab.close()


async def _bench(args, folder: Path, servers: list) -> dict:
    config, logs = make_runs(folder, args.runs, args.log_kib, servers, args.ssh_runs, args.cts, args.silence_after)
    writer = subprocess.Popen([sys.executable, "-c", WRITER, f"{args.write_every:g}", *map(str, logs)])  # noqa: ASYNC220 - started once, before the clock runs
    try:
        await asyncio.sleep(1.0)
        os.chdir(folder)  # the local runs' relative log paths and the state file
        registry = parse_registry(config.read_text(), config)
        chat = CountingChat()
        store = StateFile.open(registry.bot.state_db)
        targets = Targets(registry)
        wd = Watchdog(registry, targets, store, chat)
        judged = [0.0]
        judge = wd.judge

        def timed_judge(run, verdict, **kw):  # decide + render + commit: the watchdog's own share
            t = time.thread_time()
            try:
                return judge(run, verdict, **kw)
            finally:
                judged[0] += time.thread_time() - t

        wd.judge = timed_judge
        lags: list[float] = []
        lag_task = asyncio.create_task(loop_lag(lags))
        sweeps, asks, ask_lags, started = [], [], [], time.monotonic()
        looked, carried = [], []
        names = list(registry.runs)
        next_at = started
        if args.settle:  # the first look at every run (all due at once, carried over until done), not measured
            while time.monotonic() - started < args.settle:
                await asyncio.sleep(max(0.0, next_at - time.monotonic()))
                t = time.monotonic()
                await wd.sweep(wait=args.every * 0.9)
                next_at = max(t + args.every, time.monotonic())
            del lags[:]
            started = time.monotonic()
        # The SSH probes' bash runs under the sshd servers, not under this process: RUSAGE_CHILDREN never sees it
        # while the servers live, their own accounting does.
        self0, kids0 = cpu(resource.RUSAGE_SELF), cpu(resource.RUSAGE_CHILDREN) + sum(s.cpu_seconds() for s in servers)
        while time.monotonic() - started < args.seconds:
            await asyncio.sleep(max(0.0, next_at - time.monotonic()))
            t = time.monotonic()
            offset = 0 if args.ask_same else len(sweeps)  # the same runs each sweep, or the next ones along
            questions = (asyncio.create_task(ask(wd, registry, names[offset::max(1, len(names) // args.asks)][:args.asks],
                                                asks, ask_lags, lags, args.ask_spread))
                         if sweeps and args.asks else None)
            report = await wd.sweep(wait=args.every * 0.9)  # as the scheduled job: cut at 90 % of check_every
            if questions is not None:
                await questions
            sweeps.append(report.seconds)
            looked.append(report.probed)
            carried.append(report.carried)
            next_at = max(t + args.every, time.monotonic())  # coalesced: a late sweep is not run twice
        wall = time.monotonic() - started
        self_cpu, kids_cpu = cpu(resource.RUSAGE_SELF) - self0, cpu(resource.RUSAGE_CHILDREN) + sum(s.cpu_seconds() for s in servers) - kids0
        statuses = {}
        for state in wd.states.values():
            statuses[state.status.value] = statuses.get(state.status.value, 0) + 1
        lag_task.cancel()
        await wd.stop()
        await targets.close()
        store.close()
        costs = await asyncio.to_thread(section_costs, logs[0])
    finally:
        writer.kill()
        writer.wait()
    return {"sweeps": sweeps, "wall": wall, "self_cpu": self_cpu, "kids_cpu": kids_cpu, "costs": costs,
            "posts": chat.posts, "judge_s": judged[0], "lags": lags, "updates": chat.updates, "statuses": statuses,
            "rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, "asks": asks, "ask_lags": ask_lags,
            "looked": looked, "carried": carried}


async def ask(wd, registry, names: list[str], latencies: list[float], lag_during: list[float], lags: list[float],
              spread: float = 0.0) -> None:
    """50 people asking about 50 runs from 0.2 s into a sweep, through the scheduler's ASK path (what /run status
    does): all at once, or one every spread / len(names) seconds."""
    await asyncio.sleep(0.2)
    first = len(lags)

    async def one(i: int, name: str) -> None:
        await asyncio.sleep(i * spread / max(1, len(names)))
        t = time.perf_counter()
        await wd.probes.check(registry.runs[name], priority=Priority.ASK)
        latencies.append(time.perf_counter() - t)

    await asyncio.gather(*(one(i, n) for i, n in enumerate(names)))
    lag_during.extend(lags[first:])


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
    ap.add_argument("--runs", type=int, default=500, help="local runs")
    ap.add_argument("--ssh-runs", type=int, default=500, help="runs in containers behind loopback sshds")
    ap.add_argument("--hosts", type=int, default=5)
    ap.add_argument("--cts", type=int, default=50, help="containers in all, spread over the hosts")
    ap.add_argument("--asks", type=int, default=50, help="/run status questions during each sweep after the first")
    ap.add_argument("--every", type=float, default=10.0)
    ap.add_argument("--seconds", type=float, default=120.0)
    ap.add_argument("--log-kib", type=int, default=256)
    ap.add_argument("--write-every", type=float, default=3.0,
                    help="seconds between each log's step lines (3: production; 3600: quiet logs, an unchanged look each)")
    ap.add_argument("--silence-after", default="30s", help="every run's silence_after (its look budget: bot.core.cadence)")
    ap.add_argument("--ask-spread", type=float, default=0.0, help="seconds the questions are spread over (0: all at once)")
    ap.add_argument("--ask-same", action="store_true",
                    help="ask about the same runs every sweep (a team asking after its own runs; default: each sweep "
                         "the next runs along, so ever more runs are on the every-sweep cadence of runs asked about)")
    ap.add_argument("--settle", type=float, default=0.0,
                    help="seconds of sweeps before measuring (the first look at every run: with a long silence_after, "
                         "the steady state comes after it)")
    args = ap.parse_args()
    r = asyncio.run(bench(args))
    sweeps = r["sweeps"]
    p50, p99 = statistics.median(sweeps), pct(sweeps, 0.99)
    bot_share, probe_share = r["self_cpu"] / r["wall"], r["kids_cpu"] / r["wall"]
    total = args.runs + args.ssh_runs
    asks, ask_lags = r["asks"] or [0.0], r["ask_lags"] or [0.0]
    print(f"watchdog: {args.runs} local runs + {args.ssh_runs} in {args.cts} CTs on {args.hosts} sshd hosts, every "
          f"{args.every:g} s, for {r['wall']:.0f} s, {os.cpu_count()} CPUs, logs {args.log_kib} KiB, gpu_samples 1, no nvidia-smi")
    print(f"sweeps: {len(sweeps)} · p50 {p50:.2f} s · p99 {p99:.2f} s · all: {' '.join(f'{s:.1f}' for s in sweeps)}")
    print(f"runs probed per sweep: {' '.join(map(str, r['looked']))} · carried over (cut): {' '.join(map(str, r['carried']))} "
          f"(silence_after {args.silence_after})")
    print(f"CPU, share of one core: bot process {bot_share:.1%} · probes (bash, ssh, sshd and their children) {probe_share:.1%}")
    print(f"per run per sweep: bot {r['self_cpu'] / len(sweeps) / total * 1000:.1f} ms · "
          f"probe {r['kids_cpu'] / len(sweeps) / total * 1000:.1f} ms CPU")
    print(f"of which decide + render + commit (bot/alerts, render_alerts, store): "
          f"{r['judge_s'] / len(sweeps) / total * 1000:.2f} ms per run per sweep")
    print(f"event-loop lag (a 50 ms sleeper, what a Slack ack waits): p50 {statistics.median(r['lags']) * 1000:.0f} ms · "
          f"p99 {pct(r['lags'], 0.99) * 1000:.0f} ms · max {max(r['lags']) * 1000:.0f} ms; while the questions were "
          f"answered: p99 {pct(ask_lags, 0.99) * 1000:.0f} ms")
    print(f"{len(r['asks'])} questions during sweeps ({'all at once' if not args.ask_spread else f'over {args.ask_spread:g} s'}): answer p50 {statistics.median(asks) * 1000:.0f} ms · "
          f"p99 {pct(asks, 0.99) * 1000:.0f} ms")
    print(f"peak RSS {r['rss_mb']:.0f} MB · messages: {r['posts']} posts, {r['updates']} edits · states {r['statuses']}")
    print("probe CPU by section (ms per call, one bash each for 'bash start' and 'whole probe'):")
    for name, ms in r["costs"]:
        print(f"  {name:34} {ms:6.1f}")
    ok = p50 < 5 and bot_share < 0.10 and pct(ask_lags, 0.99) < 0.1
    print(f"target: sweep p50 < 5 s, < 10% of one core, loop lag p99 < 100 ms while asked: {'PASS' if ok else 'FAIL'} "
          f"(the bot itself: {bot_share:.1%}; with its probes: {bot_share + probe_share:.1%})")
    costs = {name.split()[0]: ms for name, ms in r["costs"]}
    print(f"RESULT runs={total} local={args.runs} ssh={args.ssh_runs} cts={args.cts} every_s={args.every:g} "
          f"silence_after={args.silence_after} ask_spread_s={args.ask_spread:g} ask_same={int(args.ask_same)} settle_s={args.settle:g} "
          f"looked_p50={statistics.median(r['looked']):.0f} carried_max={max(r['carried'])} "
          f"sweeps={len(sweeps)} sweep_p50_s={p50:.2f} sweep_p99_s={p99:.2f} "
          f"bot_cpu_pct={bot_share * 100:.1f} probe_cpu_pct={probe_share * 100:.1f} rss_mb={r['rss_mb']:.0f} "
          f"judge_ms={r['judge_s'] / len(sweeps) / total * 1000:.2f} loop_lag_p99_ms={pct(r['lags'], 0.99) * 1000:.0f} "
          f"ask_loop_lag_p99_ms={pct(ask_lags, 0.99) * 1000:.0f} ask_p50_ms={statistics.median(asks) * 1000:.0f} "
          f"ask_p99_ms={pct(asks, 0.99) * 1000:.0f} "
          f"probe_ms={costs['whole']:.1f} bash_start_ms={costs['bash']:.1f} posts={r['posts']} cpus={os.cpu_count()}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
