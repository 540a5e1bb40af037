"""`runbot demo`: a simulated run on this machine, probed by the real bot, answers printed as Slack would show them (shell)."""

from __future__ import annotations

import asyncio
import os
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

from bot.demo.smi import Samples, SmiGpu, bus_id, utilization_report
from bot.render import text as render_text
from bot.service.chat import PrintingChat
from bot.probe.checkup import check
from bot.probe.runners import LocalRunner
from bot.service.state_file import StateFile
from bot.core.verdict import Verdict
from bot.service.watchdog import Watchdog
from config.registry import load_registry

# A stand-in nvidia-smi that follows the job's phase: two H200s, GPU 0 the target, GPU 1 a drafter.
# `-q -d UTILIZATION` prints the phase's driver window (written by Demo from _WINDOWS); a query for
# index,pci.bus_id,… gets the bus ids that window names.
_FAKE_SMI = r"""#!/usr/bin/env bash
phase=$(cat {phase} 2>/dev/null || echo none)
case " $* " in *" -L "*) echo "GPU 0: NVIDIA H200 (UUID: GPU-0)"; echo "GPU 1: NVIDIA H200 (UUID: GPU-1)"; exit 0 ;; esac
case " $* " in *" -q "*) cat {folder}/window-"$phase" 2>/dev/null || cat {folder}/window-none; exit 0 ;; esac
b0='' b1=''
case " $* " in *" --query-gpu=index,pci.bus_id,"*) b0=' {bus0},' b1=' {bus1},' ;; esac
r() {{ echo $((RANDOM % ($2 - $1 + 1) + $1)); }}
case $phase in
  importing) echo "0,$b0 0, 143771, 0"; echo "1,$b1 0, 143771, 0" ;;
  loading)   echo "0,$b0 $(r 3000 25000), 143771, $(r 0 15)"; echo "1,$b1 4, 143771, 0" ;;
  training)  if ((RANDOM % 3)); then u=$(r 60 100); else u=0; fi
             echo "0,$b0 31395, 143771, $u"; echo "1,$b1 18211, 143771, $(r 70 100)" ;;
  silent)    echo "0,$b0 31395, 143771, 0"; echo "1,$b1 18211, 143771, 0" ;;
  *)         echo "0,$b0 0, 143771, 0"; echo "1,$b1 0, 143771, 0" ;;
esac
"""
# What the driver's last 14 s look like in each phase, per GPU (Max, Min, Avg): loading copies weights in
# at a few percent; training keeps the target up about two thirds of the time and the drafter steadily.
_WINDOWS = {
    "loading": (("15 %", "0 %", "6 %"), ("0 %", "0 %", "0 %")),
    "training": (("100 %", "0 %", "66 %"), ("100 %", "70 %", "86 %")),
    "none": (("0 %", "0 %", "0 %"), ("0 %", "0 %", "0 %")),
}

_CONFIG = """\
[bot]
check_every = "{every}"
alert_channel = "#training-alerts"

[defaults]
gpu_samples = 4

[runs.demo]
host = "local"
log = {log}
silence_after = "{silence}"
loading_grace = "5m"

[runs.demo.gpus]
target = [0]
drafter = [1]
"""

# (phase the job announces, what to show once it is there)
_SCRIPT = (
    ("importing", ("status",)),
    ("loading", ("status", "gpus")),
    ("training", ("status", "gpus", "tail")),
    ("silent", ("status",)),
    ("crashed", ("status", "tail")),
)


def install_smi(bin_dir: Path, phase_file: Path) -> Path:
    """Write into bin_dir an nvidia-smi that follows the phase the job writes to phase_file (two H200s)."""
    bin_dir.mkdir(parents=True, exist_ok=True)
    smi = bin_dir / "nvidia-smi"
    smi.write_text(_FAKE_SMI.format(phase=shlex.quote(str(phase_file)), folder=shlex.quote(str(bin_dir)),
                                    bus0=bus_id(0), bus1=bus_id(1)))
    smi.chmod(0o755)
    for phase, windows in _WINDOWS.items():  # the other phases (importing, silent, crashed) keep GPUs idle
        gpus = [SmiGpu(bus_id(i), gpu=w[0], gpu_samples=Samples(*w)) for i, w in enumerate(windows)]
        (bin_dir / f"window-{phase}").write_text(utilization_report(gpus))
    return smi


def _say(text: str = "") -> None:
    print(text, flush=True)


class Demo:
    def __init__(self, folder: Path, scale: float) -> None:
        self.folder, self.scale = folder, scale
        self.log = folder / "train.log"
        self.phase_file = folder / "phase"
        bin_dir = folder / "bin"
        install_smi(bin_dir, self.phase_file)
        silence = "4s" if scale >= 1 else "2s"
        config = folder / "runs.toml"
        every = "2s" if scale >= 1 else "1s"  # the fast demo's silence is short: sweep often enough to see it
        config.write_text(_CONFIG.format(log=toml_string(str(self.log)), silence=silence, every=every))
        self.registry = load_registry(config)
        self.run = self.registry.runs["demo"]
        self.runner = LocalRunner({"PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}"})
        self.started = time.monotonic()

    def start_job(self) -> subprocess.Popen:
        self.phase_file.write_text("importing")
        out = self.log.open("wb")  # like `python train.py > train.log 2>&1`
        return subprocess.Popen(
            [sys.executable, "-m", "bot.demo.job", str(self.phase_file), str(self.scale)],
            stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            cwd=Path(__file__).resolve().parent.parent,
        )

    def phase(self) -> str:
        try:
            return self.phase_file.read_text().strip()
        except OSError:
            return ""

    async def wait_for(self, phase: str, job: subprocess.Popen, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout * max(self.scale, 0.3)
        while self.phase() != phase and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
        if phase == "crashed":
            while job.poll() is None and time.monotonic() < deadline:
                await asyncio.sleep(0.1)

    async def show(self, command: str) -> Verdict:
        verdict = await check(self.run, self.runner, timeout=20)
        text = {
            "status": lambda: render_text.status(verdict, where="local"),
            "gpus": lambda: render_text.gpus(verdict),
            "tail": lambda: render_text.tail(verdict, 6),
        }[command]()
        _say(f"/run {command} demo")
        _say("\n".join("  " + line for line in text.splitlines()))
        _say()
        return verdict


def toml_string(text: str) -> str:
    """text as a TOML basic string (the demos write paths into their configs)."""
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


async def _main(demo: Demo) -> int:
    job = demo.start_job()
    # The real watchdog on its own schedule, posting to a chat that prints: the alert thread as it happens.
    watchdog = Watchdog(demo.registry, SimpleNamespace(runner_for=lambda run: demo.runner),
                        StateFile.open(demo.registry.bot.state_db), PrintingChat(lambda line: _say(f"  [alert] {line}")))
    watchdog.start()
    try:
        for phase, commands in _SCRIPT:
            await demo.wait_for(phase, job)
            # Let the phase show itself: a bar mid-way, a few steps, silence past its threshold.
            await asyncio.sleep({"loading": 3.0, "training": 2.5, "silent": 6.0}.get(phase, 1.0) * demo.scale)
            _say(f"── t+{time.monotonic() - demo.started:4.0f}s · the job is {phase} " + "─" * 20)
            for command in commands:
                await demo.show(command)
        job.wait(timeout=30)
        await watchdog.stop()
        await watchdog.sweep()  # the last word, should the crash fall between two scheduled sweeps
    finally:
        await watchdog.stop()
        watchdog.state_file.close()
        if job.poll() is None:
            job.kill()
            job.wait()
    _say("demo finished: every answer and alert above came from the real probe, diagnosis and watchdog.")
    return 0


def run_demo(*, fast: bool = False) -> int:
    _say("runbot demo — a simulated training run on this machine, probed as Slack would ask.\n")
    with tempfile.TemporaryDirectory(prefix="runbot-demo-") as tmp:
        return asyncio.run(_main(Demo(Path(tmp), 0.35 if fast else 1.0)))
