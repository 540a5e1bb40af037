"""What a question costs: the bare probe script, `runbot status` around it, and a question over a warm SSH pool.

1. `bash probe.sh` — the probe runbot builds for a local run, run by hand (its physical cost);
2. `runbot status RUN` — the whole CLI (Python start, imports, probe, diagnosis, text), as a subprocess, as an
   installed runbot runs it: its bytecode compiled once (pip does that; PYTHONDONTWRITEBYTECODE, where set, would
   compile every module on every call) and its settings kept from the call before (config.environment), both
   in the bench's temporary folder, after one untimed call; and again with nothing kept (a new cache folder each
   call: what the first call after a change to the environment or .env costs);
3. the answer to a question (`Services.check`, what `/run status` awaits before it posts) for a run in a
   container behind a loopback sshd and the `pct` stand-in, over the scheduler's warm connection.
Each median of --n runs, `gpu_samples` as configured (1 by default: this machine has no GPU; the stand-in
nvidia-smi answers at once). The local commands take turns, one run of each per round, so a shared machine's
changing load weighs on all of them alike; each also says its CPU time (the process and its children), which
another process's load inflates less than the wall clock.

    .venv/bin/python bench/probe_cost.py [--n 20] [--gpu-samples 1]
Prints a table and a last line `RESULT name=value ...`.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bot.core.window_cache import Seen, Stat  # noqa: E402
from bot.probe.replay import DefaultRun  # noqa: E402
from bot.probe.script import build_script  # noqa: E402
from bot.service.app import Services  # noqa: E402
from bot.probe.targets import Targets  # noqa: E402
from config.registry import parse_registry  # noqa: E402
from tests.sshd import SKIP_REASON, SshLab, have_sshd  # noqa: E402
from tests.standins import writer_holding  # noqa: E402

REPO = Path(__file__).resolve().parents[1]


def in_turns(commands: dict[str, Callable[[], tuple[list[str], dict | None]]], n: int) -> dict[str, tuple[float, float]]:
    """Each command (argv and environment, asked anew for each run) n times, one of each per round: the median
    wall-clock and CPU seconds of each."""
    wall: dict[str, list[float]] = {name: [] for name in commands}
    cpu: dict[str, list[float]] = {name: [] for name in commands}
    for _ in range(n):
        for name, command in commands.items():
            argv, env = command()
            before, t = resource.getrusage(resource.RUSAGE_CHILDREN), time.perf_counter()
            subprocess.run(argv, capture_output=True, check=False, cwd=REPO, env=env)
            after = resource.getrusage(resource.RUSAGE_CHILDREN)
            wall[name].append(time.perf_counter() - t)
            cpu[name].append(after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime)
    return {name: (statistics.median(wall[name]), statistics.median(cpu[name])) for name in commands}


async def warm_asks(services: Services, run, n: int) -> float:
    await services.check(run)  # opens the connection
    times = []
    for _ in range(n):
        services.scheduler.answers.forget()  # each question a probe of its own, not the last answer again
        t = time.perf_counter()
        await services.check(run)
        times.append(time.perf_counter() - t)
    await services.targets.close()
    return statistics.median(times)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=20)
    ap.add_argument("--gpu-samples", type=int, default=1)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="runbot-cost-") as tmp:
        folder = Path(tmp)
        log = folder / "train.log"
        log.write_text("".join(f"step={i} loss=2.{i % 97:02d} tok/s=14200\n" for i in range(1, 3000)))
        config = folder / "runs.toml"
        config.write_text(f'[defaults]\ngpu_samples = {args.gpu_samples}\n[runs.local]\nhost = "local"\nlog = "{log}"\n')

        script = folder / "probe.sh"
        target = DefaultRun("local", log=str(log), gpu_samples=args.gpu_samples)
        script.write_text(build_script(target, "abcdef0123456789"))
        # Told what the last look saw (bot.core.window_cache): the log as it is (a quiet log: a stat), or as it was
        # 2 KiB ago (a growing one: its new bytes and the step search).
        st = log.stat()
        seen = Stat(inode=st.st_ino, size=st.st_size, mtime=int(st.st_mtime))
        quiet, grown = folder / "quiet.sh", folder / "grown.sh"
        quiet.write_text(build_script(target, "abcdef0123456789", seen=Seen(seen, b"", b"")))
        grown.write_text(build_script(target, "abcdef0123456789",
                                      seen=Seen(replace(seen, size=seen.size - 2048), b"", b"")))
        with writer_holding(log):
            env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
            env.update(PYTHONPYCACHEPREFIX=str(folder / "pycache"), XDG_CACHE_HOME=str(folder / "cache"))
            status = [sys.executable, "-m", "bot", "--config", str(config), "status", "local"]
            subprocess.run(status, capture_output=True, check=True, cwd=REPO, env=env)  # compiles, keeps the settings
            fresh = itertools.count()
            took = in_turns({"bare": lambda: (["bash", str(script)], None),
                             "quiet": lambda: (["bash", str(quiet)], None), "grown": lambda: (["bash", str(grown)], None),
                             "cli": lambda: (status, env),
                             "unkept": lambda: (status, {**env, "XDG_CACHE_HOME": str(folder / f"cache{next(fresh)}")})},
                            args.n)
            (bare, bare_cpu), (cli, cli_cpu), (unkept, _) = took["bare"], took["cli"], took["unkept"]
            ssh = None
            if have_sshd():
                lab = SshLab(folder / "lab")
                try:
                    srv = lab.sshd("pve1")
                    srv.set_ct(200, "running")
                    text = (f'[hosts.pve1]\naddress = "127.0.0.1"\nport = {srv.port}\nuser = "{lab.user}"\n'
                            f'key = "{lab.client_key}"\nknown_hosts = "{lab.known_hosts}"\n'
                            f'[defaults]\ngpu_samples = {args.gpu_samples}\n'
                            f'[runs.ct]\nhost = "pve1"\ncontainer = 200\nlog = "{log}"\n')
                    registry = parse_registry(text, config)
                    services = Services(targets=Targets(registry), registry=registry, chat=None)  # type: ignore[arg-type]
                    ssh = asyncio.run(warm_asks(services, registry.runs["ct"], args.n))
                finally:
                    lab.close()
            else:
                print(SKIP_REASON)
    print(f"{'what (median of ' + str(args.n) + ')':<52} {'ms':>8} {'CPU ms':>8}")
    for label, name in (("bash probe.sh (the probe alone, local)", "bare"),
                        ("  told the log is as last seen (quiet)", "quiet"),
                        ("  told the log was 2 KiB shorter (growing)", "grown"),
                        ("runbot status (Python, imports, probe, verdict)", "cli"),
                        ("runbot status, settings not kept (pydantic imported)", "unkept")):
        print(f"{label:<52} {took[name][0] * 1000:>8.1f} {took[name][1] * 1000:>8.1f}")
    if ssh is not None:
        print(f"{'a question over the warm SSH pool (/run status)':<52} {ssh * 1000:>8.1f}")
    print(f"RESULT bare_probe_ms={bare * 1000:.1f} quiet_probe_cpu_ms={took['quiet'][1] * 1000:.1f} "
          f"grown_probe_cpu_ms={took['grown'][1] * 1000:.1f} bare_probe_cpu_ms={bare_cpu * 1000:.1f} "
          f"cli_status_ms={cli * 1000:.1f} cli_ratio={cli / bare:.1f} "
          f"cli_cpu_ratio={cli_cpu / bare_cpu:.1f} cli_unkept_ms={unkept * 1000:.1f} "
          f"warm_ssh_ask_ms={ssh * 1000 if ssh is not None else float('nan'):.1f} gpu_samples={args.gpu_samples}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
