"""Status-probe latency: the bot's warm SSH connection versus one `ssh` process per check.

Starts its own sshd on 127.0.0.1 (tests/sshd.py) with the `pct` stand-in, then measures,
interleaved so background load hits every series alike:
  warm    SshRunner.run on the pool's kept-open connection (what the bot does);
  cold    `ssh host "pct exec CT -- bash -c '<probe>'"`, a fresh process per check.
The probe script stamps its own start and end ($EPOCHREALTIME, on stderr), so per probe
  overhead  = warm total - the script's own time (everything the bot adds: channel, sshd
              session, remote shell + timeout + pct wrappers, transfer, parsing);
  transport = the same, minus the remote wrappers too (the whole remote command is stamped
              by the login shell): the cost of SSH itself and of this code.

    .venv/bin/python bench/ssh_latency.py [--n 60] [--log-kib 1024]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import secrets
import shlex
import statistics
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bot.probe.ssh import SshPool  # noqa: E402
from tests.sshd import SKIP_REASON, SshLab, have_sshd  # noqa: E402

CT = 201

# Used only when bot.probe.script is missing: does what a probe does (stat, tail, grep, ps).
STANDIN_PROBE = r"""
LOG={log}
stat -L -c 'size=%s mtime=%Y' -- "$LOG"
echo '@@ window'; tail -c 65536 -- "$LOG"
echo '@@ steps'; tail -c 1048576 -- "$LOG" | grep -aE 'step[ =]' | tail -n 8
echo '@@ procs'; ps -eo pid=,etimes=,args= | grep -aE 'python|torchrun' | head -n 20
"""


def probe_script(log: Path) -> tuple[str, str]:
    """(script, which): the bot's real status probe when bot.probe.script exists, else the stand-in."""
    try:
        from bot.probe.script import build_script
    except ImportError:  # TODO(lead): drop the stand-in once bot.probe.script is always there
        return STANDIN_PROBE.format(log=shlex.quote(str(log))), "standin"
    run = SimpleNamespace(log=str(log), step_pattern=None, gpu_samples=1)
    return build_script(run, secrets.token_hex(8)), "bot.probe.script"


def timed(script: str) -> str:
    """The script, stamping its own start and end on stderr as its last line."""
    return f'__t0=$EPOCHREALTIME\n{{\n{script}\n}}\necho "@@T $__t0 $EPOCHREALTIME" >&2'


def stamped_s(stderr: bytes) -> float:
    """Seconds between the two stamps on the last @@T line of stderr."""
    line = [l for l in stderr.decode(errors="replace").splitlines() if l.startswith("@@T ")][-1]
    a, b = line.split()[1:3]
    return float(b) - float(a)


def write_log(path: Path, kib: int) -> Path:
    """A training log of exactly kib KiB: step lines with a tqdm-ish line now and then."""
    line = b"step=%d loss=2.3456 tok/s=51234 elapsed=%ds\n"
    out, i = bytearray(), 0
    while len(out) < kib * 1024:
        out += line % (i, i // 10)
        i += 1
    path.write_bytes(bytes(out[: kib * 1024]))
    return path


def pct(samples: list[float], q: float) -> float:
    """The q-quantile (0..1) of samples, in milliseconds."""
    s = sorted(samples)
    return 1000 * s[min(len(s) - 1, max(0, round(q * (len(s) - 1))))]


def ssh_argv(lab: SshLab, srv, remote: str) -> list[str]:
    """A plain OpenSSH client call, verified host key, no connection sharing."""
    return [
        "ssh", "-i", str(lab.client_key), "-o", f"UserKnownHostsFile={lab.known_hosts}",
        "-o", "StrictHostKeyChecking=yes", "-o", "BatchMode=yes", "-o", "ControlMaster=no",
        "-o", "ControlPath=none", "-F", "/dev/null", "-p", str(srv.port), f"{lab.user}@127.0.0.1", remote,
    ]


async def timed_exec(argv: list[str], env: dict[str, str] | None = None) -> tuple[float, int, int]:
    """Wall time, exit status and stdout size of one process."""
    t = time.perf_counter()
    proc = await asyncio.create_subprocess_exec(
        *argv, stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE, env=env,
    )
    out, _ = await proc.communicate()
    return time.perf_counter() - t, proc.returncode, len(out)


async def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=60, help="probes per path")
    ap.add_argument("--log-kib", type=int, default=1024)
    args = ap.parse_args()
    if not have_sshd():
        print(SKIP_REASON)
        print("RESULT skipped=1")
        return 2
    with tempfile.TemporaryDirectory(prefix="runbot-bench-") as tmp:
        lab = SshLab(Path(tmp) / "lab")
        try:
            srv = lab.sshd("pve1")
            srv.set_ct(CT, "running")
            log = write_log(Path(tmp) / "train.log", args.log_kib)
            pool = SshPool({"pve1": srv.target(command_timeout=60.0)})
            runner = pool.runner("pve1", CT)
            script, which = probe_script(log)
            warm, cold, overhead, transport, script_s, failures = [], [], [], [], [], 0
            first = await runner.run(script, timeout=30)  # opens the connection
            if first.failure:
                print(f"probe failed: {first.failure}")
                return 1
            for _ in range(args.n):
                script, _ = probe_script(log)  # fresh nonce per probe, as the bot does
                probe = timed(script)
                t = time.perf_counter()
                r = await runner.run(probe, timeout=30)
                dt = time.perf_counter() - t
                if r.failure:
                    failures += 1
                    continue
                warm.append(dt)
                script_s.append(stamped_s(r.stderr))
                overhead.append(warm[-1] - script_s[-1])
                # The whole remote command stamped by the login shell sshd starts.
                t = time.perf_counter()
                r = await runner.host.run(timed(runner.command(probe, 30)), timeout=30, what="pve1")
                if r.failure:
                    failures += 1
                    continue
                transport.append(time.perf_counter() - t - stamped_s(r.stderr))
                dt, rc, n = await timed_exec(ssh_argv(lab, srv, f"pct exec {CT} -- bash -c {shlex.quote(probe)}"))
                cold.append(dt)
                failures += rc != 0 or n == 0
            await pool.close()
        finally:
            lab.close()
    w50, w95, c50, c95 = pct(warm, .5), pct(warm, .95), pct(cold, .5), pct(cold, .95)
    o50, t50, s50 = pct(overhead, .5), pct(transport, .5), pct(script_s, .5)
    speedup = c50 / w50
    print(f"status probe latency on 127.0.0.1, {args.n} probes per path, log {args.log_kib} KiB, "
          f"script {which} ({len(script)} chars, reply {len(first.stdout)} bytes), {os.cpu_count()} CPUs")
    print(f"{'series':52} {'p50 ms':>8} {'p95 ms':>8} {'mean ms':>8}")
    rows = (
        ("warm connection (bot: SshRunner.run)", warm),
        ("fresh `ssh` process per check", cold),
        ("the probe script itself (remote stamps)", script_s),
        ("bot overhead = warm - script", overhead),
        ("  of which SSH transport (minus remote wrappers)", transport),
    )
    for name, series in rows:
        print(f"{name:52} {pct(series, .5):8.1f} {pct(series, .95):8.1f} {1000 * statistics.mean(series):8.1f}")
    print(f"speedup at p50: {speedup:.1f}x (target >= 3x): {'PASS' if speedup >= 3 else 'FAIL'}; "
          f"overhead p50 {o50:.1f} ms (target < 20 ms): {'PASS' if o50 < 20 else 'FAIL'}; failures {failures}")
    print(f"RESULT warm_p50_ms={w50:.1f} warm_p95_ms={w95:.1f} cold_p50_ms={c50:.1f} cold_p95_ms={c95:.1f} "
          f"speedup_p50={speedup:.2f} script_p50_ms={s50:.1f} overhead_p50_ms={o50:.1f} transport_p50_ms={t50:.1f} "
          f"failures={failures} script={which} n={args.n}")
    return 0 if failures == 0 else 1


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
