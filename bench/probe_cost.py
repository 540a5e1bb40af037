"""What a question costs: the bare probe script, `runbot status` around it, and a question over a warm SSH pool.

1. `bash probe.sh` — the probe runbot builds for a local run, run by hand (its physical cost);
2. `runbot status RUN` — the whole CLI (Python start, imports, probe, diagnosis, text), as a subprocess;
3. the answer to a question (`Services.check`, what `/run status` awaits before it posts) for a run in a
   container behind a loopback sshd and the `pct` stand-in, over the scheduler's warm connection.
Each median of --n runs, `gpu_samples` as configured (1 by default: this machine has no GPU; the stand-in
nvidia-smi answers at once).

    .venv/bin/python bench/probe_cost.py [--n 20] [--gpu-samples 1]
Prints a table and a last line `RESULT name=value ...`.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bot.probe.replay import DefaultRun  # noqa: E402
from bot.probe.script import build_script  # noqa: E402
from bot.service.app import Services  # noqa: E402
from bot.probe.targets import Targets  # noqa: E402
from config.registry import parse_registry  # noqa: E402
from tests.sshd import SKIP_REASON, SshLab, have_sshd  # noqa: E402
from tests.standins import writer_holding  # noqa: E402

REPO = Path(__file__).resolve().parents[1]


def median_s(fn, n: int) -> float:
    times = []
    for _ in range(n):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


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
        script.write_text(build_script(DefaultRun("local", log=str(log), gpu_samples=args.gpu_samples), "abcdef0123456789"))
        with writer_holding(log):
            bare = median_s(lambda: subprocess.run(["bash", str(script)], capture_output=True, check=False), args.n)
            cli = median_s(lambda: subprocess.run([sys.executable, "-m", "bot", "--config", str(config), "status", "local"],
                                                  capture_output=True, check=False, cwd=REPO), args.n)
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
    print(f"{'what (median of ' + str(args.n) + ')':<52} {'ms':>8}")
    print(f"{'bash probe.sh (the probe alone, local)':<52} {bare * 1000:>8.1f}")
    print(f"{'runbot status (Python, imports, probe, verdict)':<52} {cli * 1000:>8.1f}")
    if ssh is not None:
        print(f"{'a question over the warm SSH pool (/run status)':<52} {ssh * 1000:>8.1f}")
    print(f"RESULT bare_probe_ms={bare * 1000:.1f} cli_status_ms={cli * 1000:.1f} cli_ratio={cli / bare:.1f} "
          f"warm_ssh_ask_ms={ssh * 1000 if ssh is not None else float('nan'):.1f} gpu_samples={args.gpu_samples}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
