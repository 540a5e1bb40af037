"""How fast does `runbot serve` acknowledge and answer 50 concurrent signed `/run status` (or `runs`) requests?

Starts `runbot serve` (HTTP mode) as a subprocess against a local Slack stand-in, with one
`host = "local"` run (gpu_samples = 5) and a stand-in nvidia-smi; fires N signed slash commands
at once and times each one to its ack (the HTTP 200) and to its answer (the response_url post).
Only 127.0.0.1 is ever contacted.

Usage: .venv/bin/python bench/slack_ack.py [--n 50] [--rounds 3] [--samples 5] [--runs 1]
                                           [--command status|runs] [--spread SECONDS]
(`--command runs --n 200 --spread 10 --runs 20`: 200 `/run runs` over 10 s, each asking about 20 runs.)
Prints a table and a last line `RESULT name=value ...`.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import aiohttp

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.slack_stub import BOT_TOKEN, SECRET, SlackStub, sign, slash_body
from tests.standins import fake_nvidia_smi

SMI = "".join(f"{i}, 31395, 143771, {60 + i * 5}\n" for i in range(8))


def pct(values: list[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100)."""
    ordered = sorted(values)
    return ordered[max(0, min(len(ordered) - 1, round(q / 100 * len(ordered) + 0.5) - 1))]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def one(session: aiohttp.ClientSession, url: str, stub: SlackStub, name: str, run: str,
              command: str = "status", delay: float = 0.0) -> tuple[float, float, float]:
    await asyncio.sleep(delay)
    body = slash_body("runs" if command == "runs" else f"status {run}", response_url=stub.response_url(name))
    t0 = time.monotonic()
    async with session.post(url, data=body, headers=sign(body, SECRET)) as resp:
        await resp.read()
        assert resp.status == 200, resp.status
    ack = time.monotonic()
    await stub.until(lambda: stub.responses_to(name), timeout=120)
    answered = next(t for t, kind, n, _ in stub.events if kind == "response" and n == name)
    return t0, ack - t0, answered - t0


async def burst(url: str, stub: SlackStub, n: int, tag: str, runs: int = 1, command: str = "status",
                spread: float = 0.0) -> tuple[list[float], list[float]]:
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
        results = await asyncio.gather(*(one(session, url, stub, f"{tag}-{i}", f"bench{i % runs}", command,
                                             spread * i / max(1, n)) for i in range(n)))
    return [r[1] for r in results], [r[2] for r in results]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=50, help="concurrent requests per round")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--samples", type=int, default=5, help="gpu_samples of the run")
    ap.add_argument("--runs", type=int, default=1,
                    help="spread the requests over this many runs (1: all ask about the same run, "
                         "and share its probe; N: N probes at once)")
    ap.add_argument("--command", choices=("status", "runs"), default="status")
    ap.add_argument("--spread", type=float, default=0.0, help="send the N requests evenly over this many seconds")
    args = ap.parse_args()

    with tempfile.TemporaryDirectory(prefix="runbot-bench-") as tmp, SlackStub() as stub:
        tmp = Path(tmp)
        fake_nvidia_smi(tmp / "bin", [SMI])
        config = ""
        for r in range(args.runs):
            log = tmp / f"train{r}.log"
            log.write_text("".join(f"step={s} loss={2 + 8 / s:.4f} tok/s={14200 + s % 97} elapsed={s * 0.8:.1f}s\n"
                                   for s in range(1, 400)))
            config += (f'[runs.bench{r}]\nhost = "local"\nlog = "{log}"\ngpu_samples = {args.samples}\n'
                       f'silence_after = "1h"\ngpus = {{ target = [0, 1, 2, 3, 4], drafter = [5, 6, 7] }}\n')
        (tmp / "runs.toml").write_text(config)
        port = free_port()
        env = {**os.environ, "PORT": str(port), "SLACK_BOT_TOKEN": BOT_TOKEN, "SLACK_SIGNING_SECRET": SECRET,
               "SLACK_API_BASE_URL": stub.api_url, "RUNBOT_CONFIG": str(tmp / "runs.toml"),
               "PATH": f"{tmp / 'bin'}{os.pathsep}{os.environ['PATH']}",
               "PYTHONPATH": str(REPO)}  # this checkout's packages, whatever the venv's install says
        env.pop("SLACK_APP_TOKEN", None)
        with (tmp / "serve.log").open("wb") as serve_log:
            server = subprocess.Popen([sys.executable, "-m", "bot", "serve"], cwd=tmp, env=env,
                                      stdout=subprocess.DEVNULL, stderr=serve_log)
        try:
            stub.wait_for(lambda: _healthy(port), timeout=30)
            url = f"http://127.0.0.1:{port}/slack/events"
            asyncio.run(burst(url, stub, 1, "warm"))  # bash and the page cache warm up
            solo = [asyncio.run(burst(url, stub, 1, f"solo{i}")) for i in range(3)]
            acks, answers = [], []
            for r in range(args.rounds):
                a, b = asyncio.run(burst(url, stub, args.n, f"r{r}", args.runs, args.command, args.spread))
                acks += a
                answers += b
        finally:
            server.send_signal(signal.SIGTERM)
            code = server.wait(30)

    ms = lambda s: s * 1000
    solo_answers = [x for _, b in solo for x in b]
    rows = [
        ("one request alone: answer", statistics.median(solo_answers)),
        ("ack p50", pct(acks, 50)),
        ("ack p99", pct(acks, 99)),
        ("ack max", max(acks)),
        ("answer p50", pct(answers, 50)),
        ("answer p99", pct(answers, 99)),
    ]
    when = f"over {args.spread:g} s" if args.spread else "at once"
    print(f"runbot serve (HTTP mode), {args.n} signed /run {args.command} {when}, {args.runs} run(s) "
          f"× {args.rounds} rounds, gpu_samples={args.samples}, {os.cpu_count()} CPUs, serve exit {code}")
    print(f"{'measure':<32} {'ms':>8}")
    for label, value in rows:
        print(f"{label:<32} {ms(value):>8.0f}")
    print(f"RESULT command={args.command} spread_s={args.spread:g} n={args.n} runs={args.runs} rounds={args.rounds} cpus={os.cpu_count()} solo_answer_ms={ms(statistics.median(solo_answers)):.0f} "
          f"ack_p50_ms={ms(pct(acks, 50)):.0f} ack_p99_ms={ms(pct(acks, 99)):.0f} "
          f"answer_p50_ms={ms(pct(answers, 50)):.0f} answer_p99_ms={ms(pct(answers, 99)):.0f} "
          f"ack_p99_ok={int(pct(acks, 99) < 0.3)} answer_p50_ok={int(pct(answers, 50) < 1.5)}")


def _healthy(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.2) as s:
            s.sendall(b"GET /healthz HTTP/1.0\r\n\r\n")
            return b"200" in s.recv(100)
    except OSError:
        return False


if __name__ == "__main__":
    main()
