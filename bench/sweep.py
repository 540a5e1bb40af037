"""A full sweep: probe 200 runs spread over 4 hosts (4 sshds on 127.0.0.1) at once.

Each host is its own sshd (tests/sshd.py, default MaxSessions 10) with 50 running containers
behind the `pct` stand-in; every run has a log of the same size. Sweeps once cold (opening
the 4 connections) and once warm, and reports wall time, per-host peak channels on the one
connection, channel-open refusals and failures, this process's CPU seconds and peak RSS.

    .venv/bin/python bench/sweep.py [--runs 200] [--hosts 4] [--log-kib 256]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import resource
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.ssh_latency import probe_script, write_log  # noqa: E402
from bot.probe.ssh import SshPool  # noqa: E402
from tests.sshd import SKIP_REASON, SshLab, have_sshd  # noqa: E402

FIRST_CT = 100


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


async def sweep(pool: SshPool, runs: list[tuple[str, int, Path]], timeout: float, servers, *,
                transport_only: bool = False) -> dict:
    """Probe every run at once; the pool's per-host caps do the pacing."""
    remote = sum(s.cpu_seconds() for s in servers)
    cpu, t = time.process_time(), time.perf_counter()

    async def one(host: str, ct: int, log: Path):
        # transport_only: just the 64 KiB window, to show what SSH itself costs.
        script = f"tail -c 65536 -- {log}" if transport_only else probe_script(log)[0]
        r = await pool.runner(host, ct).run(script, timeout=timeout)
        done = transport_only or b"@@ end" in r.stdout or b"@@ procs" in r.stdout  # ran to its end
        return r, done

    results = await asyncio.gather(*(one(*r) for r in runs))
    wall, cpu = time.perf_counter() - t, time.process_time() - cpu
    return {"wall": wall, "cpu": cpu, "remote_cpu": sum(s.cpu_seconds() for s in servers) - remote,
            "failed": [r.failure for r, _ in results if r.failure],
            "complete": sum(1 for r, done in results if done and not r.failure),
            "bytes": sum(len(r.stdout) for r, _ in results)}


async def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=200)
    ap.add_argument("--hosts", type=int, default=4)
    ap.add_argument("--log-kib", type=int, default=256)
    ap.add_argument("--timeout", type=float, default=30.0)
    args = ap.parse_args()
    if not have_sshd():
        print(SKIP_REASON)
        print("RESULT skipped=1")
        return 2
    with tempfile.TemporaryDirectory(prefix="runbot-sweep-") as tmp:
        lab = SshLab(Path(tmp) / "lab")
        try:
            servers = [lab.sshd(f"pve{i + 1}") for i in range(args.hosts)]
            runs = []
            for i in range(args.runs):
                srv = servers[i % args.hosts]
                ct = FIRST_CT + i // args.hosts
                srv.set_ct(ct, "running", name=f"train{i}")
                runs.append((srv.name, ct, write_log(Path(tmp) / f"run{i}.log", args.log_kib)))
            pool = SshPool({s.name: s.target(command_timeout=args.timeout) for s in servers})
            rss_before = peak_rss_mb()
            cold = await sweep(pool, runs, args.timeout, servers)
            stats_cold = pool.stats()
            warm = await sweep(pool, runs, args.timeout, servers)
            bare = await sweep(pool, runs, args.timeout, servers, transport_only=True)
            stats = pool.stats()
            conns = {s.name: s.connections() for s in servers}
            await pool.close()
        finally:
            lab.close()
    rss = peak_rss_mb()
    _, which = probe_script(Path("/dev/null"))
    print(f"sweep: {args.runs} runs over {args.hosts} hosts (sshd MaxSessions 10, max_channels 8), "
          f"logs {args.log_kib} KiB each, script {which}, {os.cpu_count()} CPUs")
    print(f"{'pass':34} {'wall s':>7} {'bot cpu s':>9} {'sshd+remote cpu s':>17} {'ok':>4} {'failed':>6} {'MB in':>6}")
    for name, r in (("cold (opens 4 connections)", cold), ("warm", warm),
                    ("warm, transport only (tail -c 64K)", bare)):
        print(f"{name:34} {r['wall']:7.2f} {r['cpu']:9.2f} {r['remote_cpu']:17.2f} {r['complete']:4d} "
              f"{len(r['failed']):6d} {r['bytes'] / 1e6:6.1f}")
    print(f"{'host':8} {'connects':>8} {'sshd conns':>10} {'peak ch':>8} {'refusals':>8} {'open fail':>9}")
    for name, s in stats.items():
        print(f"{name:8} {s['connects']:8d} {conns.get(name, 0):10d} {s['peak_channels']:8d} "
              f"{s['channel_open_refusals']:8d} {s['channel_open_failures']:9d}")
    for f in sorted(set(cold["failed"] + warm["failed"] + bare["failed"]))[:5]:
        print("failure:", f)
    peak = max(s["peak_channels"] for s in stats.values())
    refusals = sum(s["channel_open_refusals"] for s in stats.values())
    open_failures = sum(s["channel_open_failures"] for s in stats.values())
    failures = len(cold["failed"]) + len(warm["failed"]) + len(bare["failed"])
    ok = cold["wall"] < 5 and open_failures == 0 and failures == 0 and rss < 150
    print(f"cold sweep {cold['wall']:.2f} s (target < 5 s), channel-open failures {open_failures} (target 0), "
          f"peak RSS {rss:.0f} MB (target < 150 MB; {rss_before:.0f} MB before the sweeps): {'PASS' if ok else 'FAIL'}")
    print(f"RESULT wall_s={cold['wall']:.2f} warm_wall_s={warm['wall']:.2f} runs={args.runs} hosts={args.hosts} "
          f"failures={failures} channel_open_failures={open_failures} channel_open_refusals={refusals} "
          f"peak_channels={peak} connects={sum(s['connects'] for s in stats_cold.values())} "
          f"cpu_s={cold['cpu']:.2f} remote_cpu_s={cold['remote_cpu']:.2f} transport_wall_s={bare['wall']:.2f} "
          f"transport_cpu_s={bare['cpu']:.2f} rss_mb={rss:.0f} cpus={os.cpu_count()} script={which}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
