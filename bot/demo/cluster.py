"""`runbot demo --cluster`: a Proxmox node, two CTs and Slack on 127.0.0.1, walked through as a new user would (shell)."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable

from bot.demo import install_smi, toml_string
from bot.demo.lab.slack import APP_TOKEN, BOT_TOKEN, SlackStub
from bot.demo.lab.sshd import SshLab, have_sshd

MISSING_SSHD = ("runbot demo --cluster needs OpenSSH's sshd on this machine (it plays the Proxmox node): "
                "apt-get install openssh-server")
CHANNEL, CHANNEL_NAME = "C0ALERTS", "training-alerts"
RUN, HOST = "train-7b", "pve1"

# A CT shares this machine's process table; a real one has its own. Its `ps` (first on its PATH, as pct's
# stand-in puts a CT's own bin there) shows only the CT's processes, so discovery finds each job in its own CT.
_CT_PS = """#!/usr/bin/env bash
{ps} "$@" | awk -v keep="$(cat "${{0%/*}}/pids" 2>/dev/null)" \\
  'BEGIN {{ n = split(keep, k, " "); for (i = 1; i <= n; i++) mine[k[i]] = 1 }} $1 in mine || $1 !~ /^[0-9]+$/'
"""
# The other CT's train.py: a run nobody configured yet, for `discover` to find (a few steps, then it waits).
_OTHER_JOB = ("import sys, time\nfor s in range(1, 6):\n"
              "    print(f'step={s * 10} loss={3 - s / 10:.2f} tok/s=9800', flush=True)\ntime.sleep(900)\n")

_CONFIG = """\
# Written by `runbot demo --cluster` for its lab: a Proxmox node on 127.0.0.1 with its own keys.
[bot]
check_every = "{every}"
alert_channel = "{channel}"
state_db = {state_db}
probe_timeout = "20s"

[defaults]
gpu_samples = 2

[hosts.{host}]
address = "127.0.0.1"
port = {port}
user = {user}
key = {key}
known_hosts = {known_hosts}
connect_timeout = "5s"
host_view = true

[runs.{run}]
host = "{host}"
container = 200
log = {log}
silence_after = "{silence}"
loading_grace = "5m"

[runs.{run}.gpus]
target = [0]
drafter = [1]
"""


def _say(text: str = "") -> None:
    print(text, flush=True)


class Walk:
    """The lab (sshd, CTs, Slack stand-in), its config, and each step's command as a user types it."""

    def __init__(self, folder: Path, scale: float, stack: contextlib.ExitStack) -> None:
        self.folder, self.scale, self.stack, self.started = folder, scale, stack, time.monotonic()
        self.cues = folder / "cues"
        self.cues.mkdir()
        self.slack = stack.enter_context(SlackStub())
        self.slack.channels[CHANNEL] = {"name": CHANNEL_NAME, "is_member": True}
        self.lab = SshLab(folder / "lab")
        stack.callback(self.lab.close)
        self.srv = self.lab.sshd(HOST)
        self.config = folder / "runs.toml"
        # Socket Mode, the usual choice behind a cluster's firewall: the bot connects out, to the stand-in here.
        self.env = {**os.environ, "RUNBOT_CONFIG": str(self.config), "SLACK_BOT_TOKEN": BOT_TOKEN,
                    "SLACK_APP_TOKEN": APP_TOKEN, "SLACK_API_BASE_URL": self.slack.api_url}
        for name in ("RUNBOT_STATE_DB", "RUNBOT_LOG_LEVEL", "SLACK_SIGNING_SECRET", "PORT"):
            self.env.pop(name, None)
        self.log = folder / "ct200" / "train.log"  # run train-7b's, in CT 200

    # -- the lab --

    def _ct(self, vmid: int, name: str, folder: Path) -> Path:
        """A running CT for pct's stand-in; its own bin holds its `ps` (and the caller's nvidia-smi)."""
        self.srv.set_ct(vmid, "running", name)
        bin_dir = self.srv.pct_state / f"{vmid}.bin"
        bin_dir.mkdir()
        ps = bin_dir / "ps"
        ps.write_text(_CT_PS.format(ps=shutil.which("ps") or "/bin/ps"))
        ps.chmod(0o755)
        folder.mkdir(parents=True)
        return bin_dir

    def _spawn(self, bin_dir: Path, argv: list[str], log: Path) -> subprocess.Popen:
        with log.open("ab") as out:  # like `python train.py >> train.log 2>&1`
            proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                    cwd=Path(__file__).resolve().parents[2])
        self.stack.callback(_end, proc)
        with (bin_dir / "pids").open("a") as pids:
            pids.write(f"{proc.pid} ")
        return proc

    def start_jobs(self) -> None:
        ct200 = self.folder / "ct200"
        bin_dir = self._ct(200, RUN, ct200)
        phase_file = ct200 / "phase"
        phase_file.write_text("importing")
        install_smi(bin_dir, phase_file)
        self._spawn(bin_dir, [sys.executable, "-m", "bot.demo.job", str(phase_file), str(self.scale),
                                         str(self.cues)], self.log)
        ct201 = self.folder / "ct201"
        bin_dir = self._ct(201, "llama-13b", ct201)
        (ct201 / "train.py").write_text(_OTHER_JOB)
        self._spawn(bin_dir, [sys.executable, str(ct201 / "train.py"), "--model", "llama-13b"], ct201 / "train.log")

    def write_config(self) -> None:
        fast = self.scale < 1
        q = toml_string
        self.config.write_text(_CONFIG.format(
            every="1s" if fast else "2s", channel=CHANNEL, state_db=q(str(self.folder / "state.sqlite3")),
            host=HOST, port=self.srv.port, user=q(self.lab.user), key=q(str(self.lab.client_key)),
            known_hosts=q(str(self.lab.known_hosts)), run=RUN, log=q(str(self.log)), silence="3s" if fast else "6s"))

    # -- what the user sees --

    def step(self, title: str) -> None:
        _say(f"── t+{time.monotonic() - self.started:4.0f}s · {title} " + "─" * max(4, 60 - len(title)))

    def runbot(self, *args: str, show: Callable[[str], bool] = lambda line: True) -> int:
        """Run `runbot ARGS` as the user would, and print what it prints (indented)."""
        _say(f"$ runbot {' '.join(args)}")
        done = subprocess.run([sys.executable, "-m", "bot", *args], env=self.env, cwd=self.folder,
                              stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=120)
        for line in (done.stdout + done.stderr).splitlines():
            if show(line):
                _say(f"  {line}")
        _say(f"  (exit {done.returncode})")
        _say()
        return done.returncode

    def cue(self, name: str) -> None:
        (self.cues / name).write_text("")


class Serve:
    """`runbot serve` in its own process, its JSON log in a file; what it posts is read back from the Slack stand-in."""

    def __init__(self, walk: Walk) -> None:
        self.walk, self.seen = walk, 0
        self.log = walk.folder / "serve.log"
        with self.log.open("wb") as err:
            self.proc = subprocess.Popen([sys.executable, "-m", "bot", "serve"], env=walk.env, cwd=walk.folder,
                                         stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=err)
        walk.stack.callback(_end, self.proc)

    def sweeps(self) -> int:
        return self.log.read_text(errors="replace").count('"msg": "sweep: ')

    def wait(self, what: str, done: Callable[[], bool], timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while not done():
            self.show_posts()
            if self.proc.poll() is not None:
                raise _Stuck(f"runbot serve exited {self.proc.returncode} waiting for {what}", self.log)
            if time.monotonic() > deadline:
                raise _Stuck(f"no {what} after {timeout:.0f} s", self.log)
            time.sleep(0.1)
        self.show_posts()

    def posts(self) -> list[dict]:
        return self.walk.slack.posts("chat.postMessage")

    def show_posts(self) -> None:
        """Print each message posted since the last look, as the channel shows it (replies under their parent)."""
        posts = self.posts()
        for post in posts[self.seen:]:
            where = "  ↳ in the thread" if post.get("thread_ts") else f"  #{CHANNEL_NAME}"
            for i, line in enumerate(str(post.get("text", "")).splitlines()[:4]):
                _say(f"{where if i == 0 else ' ' * len(where)}  {line}")
        self.seen = len(posts)

    def said(self, word: str) -> bool:
        return any(word in str(p.get("text", "")) for p in self.posts())

    def stop(self) -> int:
        self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(30)


class _Stuck(Exception):
    def __init__(self, what: str, log: Path) -> None:
        super().__init__(what)
        self.log = log


def _interrupted(*_: object) -> None:
    """SIGTERM ends the demo as Ctrl-C does: through the same cleanup."""
    raise KeyboardInterrupt


def _end(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.kill()
        proc.wait()


def _walk(walk: Walk) -> int:
    walk.start_jobs()
    walk.step("init: a starter config")
    walk.runbot("init", str(walk.config))
    walk.write_config()
    _say(f"The demo fills it in for its lab: {HOST} is an sshd on 127.0.0.1:{walk.srv.port} with its own keys and")
    _say(f"known_hosts (under {walk.folder}), run `{RUN}` is a job in CT 200; CT 201 runs a job nobody configured.")
    _say()
    walk.step("doctor: every piece a working install needs")
    walk.runbot("doctor")
    walk.step(f"discover: what runs on {HOST}")
    walk.runbot("discover", HOST, show=lambda line: bool(line.strip()))
    walk.step(f"status: what {RUN} is doing")
    deadline = time.monotonic() + 60
    while (walk.log.read_text(errors="replace").count("step=") < 2) and time.monotonic() < deadline:
        time.sleep(0.2)  # past loading: the status to show is a training one
    walk.runbot("status", RUN)
    walk.step("serve: the bot and its watchdog (alerts go to the Slack stand-in)")
    _say("$ runbot serve")
    serve = Serve(walk)
    serve.wait("first sweep", lambda: serve.sweeps() >= 1, 60)
    serve.wait("Socket Mode connection", lambda: walk.slack.socket_clients > 0, 30)
    _say("  connected to Slack (Socket Mode), answering /run, the watchdog sweeping every check_every;")
    _say("  its JSON log lines go to stderr (here: serve.log)")
    _say()
    walk.step("the job goes silent (alive, no output)")
    walk.cue("silence")
    serve.wait("alert for the silence", lambda: serve.said("silent"), 90)
    walk.step("the job comes back")
    walk.cue("recover")
    serve.wait("recovery in the thread", lambda: serve.said("recovered"), 90)
    walk.step("the job crashes (CUDA out of memory)")
    walk.cue("crash")
    serve.wait("crash in the thread", lambda: serve.said("crashed"), 90)
    serve.wait("the run's summary", lambda: serve.said("summary"), 30)
    code = serve.stop()
    _say(f"  (runbot serve stopped by SIGTERM: exit {code})")
    _say()
    return code


def run_cluster_demo(*, fast: bool = False) -> int:
    if not have_sshd():
        print(MISSING_SSHD, file=sys.stderr)
        return 1
    _say("runbot demo --cluster — a Proxmox node, two CTs and Slack, all on 127.0.0.1, walked through as you would.\n")
    previous = signal.signal(signal.SIGTERM, _interrupted)
    try:
        with tempfile.TemporaryDirectory(prefix="runbot-cluster-") as tmp, contextlib.ExitStack() as stack:
            try:
                code = _walk(Walk(Path(tmp), 0.35 if fast else 1.0, stack))
            except _Stuck as exc:  # said in one line, with the bot's last words, before the lab goes
                tail = exc.log.read_text(errors="replace").splitlines()[-5:] if exc.log.exists() else []
                print("\n".join([f"runbot demo --cluster: {exc}", *tail]), file=sys.stderr)
                return 1
    except KeyboardInterrupt:
        print("runbot demo --cluster: stopped; the lab is taken down", file=sys.stderr)
        return 130
    finally:
        signal.signal(signal.SIGTERM, previous)
    _say("demo finished: every answer above came from runbot itself, over a real SSH connection; every alert")
    _say("from its watchdog, through Slack's Web API (a stand-in on this machine). The lab is gone.")
    return code
