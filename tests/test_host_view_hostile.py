"""A CT's root against the host view, end to end: a real sshd, the `pct` stand-in, CTs that flood, forge the
probe's markers and print control bytes, bidi and line separators. Each changes nothing but its own block,
and the bot reading them stays small."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import tempfile
import threading
import time
import tomllib
from pathlib import Path

import pytest

from bot.core.host_view import APPS_MAX, CT_BYTES, HOST_ANSWER_BYTES, Cut, Unit, discovered
from bot.probe.runners import LocalRunner
from bot.probe.targets import Targets
from bot.service.app import Services
from bot.service.host_view import host_lines
from config.registry import load_registry
from handlers.commands import dispatch
from tests.host_standins import FLOOD, can_make_namespaces, ct_namespaces, forge, hostile_ct
from tests.sshd import PCT_BIN, SKIP_REASON, have_sshd
from tests.standins import REPO
from tests.test_host_view import slack_code
from tests.test_host_view_ssh import Box, ChatUpdates, probe

pytestmark = [pytest.mark.skipif(not have_sshd(), reason=SKIP_REASON),
              pytest.mark.skipif(not can_make_namespaces(), reason="CTs as PID namespaces need root and unshare")]

RSS_LIMIT = 150 << 20  # the bound for the bot while a CT floods or forges
TOKEN = "hf_" + "A1b2C3d4E5" * 4  # a credential on a command line, and in a path


@pytest.fixture
def node_tmp(tmp_path):
    d = tmp_path / "node-tmp"
    d.mkdir()
    return d


@pytest.fixture
def box(tmp_path, node_tmp):
    b = Box(tmp_path, tmpdir=node_tmp)
    yield b
    b.close()


# `python -m bot ARGS`, saying its own peak RSS when it exits (getrusage's ru_maxrss would be the pytest
# parent's: Linux carries it over fork and exec; tests.standins.peak_rss_bytes says why).
_WITH_PEAK = """
import atexit, os, runpy, sys
from tests.standins import peak_rss_bytes
atexit.register(lambda: open(os.environ["RUNBOT_PEAK_FILE"], "w").write(str(peak_rss_bytes())))
sys.argv = ["runbot", *sys.argv[1:]]
runpy.run_module("bot", run_name="__main__")
"""


def cli_with_peak_rss(*args: str) -> tuple[subprocess.CompletedProcess, int]:
    """`runbot ARGS` as a user runs it, and the most memory (RSS, bytes) it ever held."""
    with tempfile.TemporaryDirectory() as tmp:
        peak_file = Path(tmp) / "peak"
        done = subprocess.run([sys.executable, "-c", _WITH_PEAK, *args], capture_output=True, text=True, timeout=300,
                              env={**os.environ, "PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO),
                                   "RUNBOT_PEAK_FILE": str(peak_file)}, cwd=REPO)
        return done, int(peak_file.read_text())


class Watch:
    """What the node's TMPDIR ever held while a probe ran (polled every 10 ms)."""

    def __init__(self, d: Path) -> None:
        self.d, self.seen, self._stop = d, set(), threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.seen |= set(os.listdir(self.d))
            time.sleep(0.01)

    def __enter__(self) -> "Watch":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        self.seen |= set(os.listdir(self.d))


def test_a_flooding_ct_is_cut_on_the_host_and_the_bot_stays_small(box, node_tmp, capsys):
    # 300 MB of process lines, 50 MB on stderr, then 300 MB without a newline: the review's flood.
    hostile_ct(box.srv.pct_state, 207, "flood", FLOOD)
    with ct_namespaces(box.srv.pct_state, [(200, "train-7b", box.logs[200]), (208, "llama", box.logs[208])]):
        with Watch(node_tmp) as watch:
            started = time.monotonic()
            out, peak = cli_with_peak_rss("--config", str(box.config), "discover", "pve1")
            took = time.monotonic() - started
            view = probe(box, discover=True)
    with capsys.disabled():
        print(f"\n  a CT flooding 650 MB: `runbot discover` peaked at {peak / 2**20:.0f} MiB RSS, {took:.1f} s")
    assert out.returncode == 0, out.stderr
    assert peak < RSS_LIMIT, peak
    assert "# CT 207 flood: answer cut at 1 MiB (only what it printed before that was read)" in out.stdout
    assert "[runs.llama]  # CT 208 llama" in out.stdout and f'log = "{box.logs[208]}"' in out.stdout
    assert "# already configured as [runs.train-7b]: CT 200" in out.stdout
    assert watch.seen == set()  # nothing, not even for a moment: each CT's answer is held in memory, bounded
    assert view.scans[207].cut == Cut(Unit.BYTES, CT_BYTES)
    assert view.scans[208].cut is None and view.scans[208].error is None
    assert all(len(line) < 600 for line in out.stdout.splitlines())


def _others(view, but: int):
    return sorted((f.vmid, f.log, f.others, f.args, f.gpus) for f in discovered(view, []) if f.vmid != but)


def test_a_ct_that_forges_the_probes_markers_changes_only_its_own_block(box):
    spec = [(201, "eval", box.logs[201]), (205, "later", box.logs[205])]
    with ct_namespaces(box.srv.pct_state, spec):
        honest = probe(box, discover=True)
        hostile_ct(box.srv.pct_state, 203, "forger", forge(205, box.logs[203]))
        forged = probe(box, discover=True)
    assert forged.failure is None, forged.failure
    assert sorted(forged.scans) == [201, 203, 205]  # the CTs scanned after it are all there
    assert _others(forged, 203) == _others(honest, 203)  # CT 205's block is CT 205's: no /root/.ssh/id_rsa
    assert [g.uuid for g in forged.gpus] == [f"GPU-{i}" for i in range(8)] == [g.uuid for g in honest.gpus]
    assert forged.apps == honest.apps == ()
    own = {p.args: p.files for p in forged.scans[203].procs}
    assert own["python train.py"] == ((1, str(box.logs[203])),)  # its own run, as it said


CONTROL = ("printf 'p\\t7\\t50\\tpython train.py --hf_token {token} \\033[2J\\033]0;pwned\\007 \\302\\23331m "
           "\\342\\200\\256lave\\342\\200\\250next\\n'\n"
           "printf 'f\\t7\\t1\\t/data/run\\342\\200\\250.log\\n'\n"
           "printf 'p\\t8\\t50\\tpython other.py\\n'\n"
           "printf 'f\\t8\\t1\\t%s\\n' \"/data/it's \\\"q\\\" \\`x\\` \\\\back.log\"\n"
           "printf 'p\\t9\\t50\\tpython secret.py\\n'\n"
           "printf 'f\\t9\\t1\\t/data/{token}/train.log\\n'\n").format(token=TOKEN)
NAME = "ctl\033]0;pwned\007\u202eevil"


def _printable(text: str) -> list[str]:
    return [line for line in text.splitlines() if not line.isprintable()]


def test_control_bytes_bidi_and_dotted_names_print_as_text_and_paste_into_a_valid_config(box):
    hostile_ct(box.srv.pct_state, 211, NAME, CONTROL)
    with ct_namespaces(box.srv.pct_state, [(210, "train.lab.example", box.logs[210])]):
        out, _ = cli_with_peak_rss("--config", str(box.config), "discover", "pve1")
        slack = asyncio.run(_slack_discover(box, "discover pve1 here"))
    assert out.returncode == 0, out.stderr
    text = out.stdout
    assert _printable(text) == []  # no ESC, C1, bidi or line separator reaches the terminal
    assert TOKEN not in text and "hf_[redacted]" in text
    assert '[runs."train.lab.example"]  # CT 210 train.lab.example' in text  # one table, not three nested
    # The CT's name and argv as text: their escapes gone, bidi and line separators spaces, the secret redacted.
    assert "[runs.ctl-0-pwned-evil]  # CT 211 ctl evil: python train.py --hf_token hf_[redacted] lave next" in text
    # A path runbot's config would refuse, or one that looks like it holds a credential: offered commented out.
    assert "# (its log's path holds characters runbot's config refuses (shown escaped); then uncomment)" in text
    assert '# log = "/data/run\\u2028.log"' in text and '# log = "/data/hf_[redacted]/train.log"' in text
    for pasted in (text, slack):
        config = box.config.read_text() + "\n" + pasted + "\n"
        tomllib.loads(config)
        box.config.with_name("pasted.toml").write_text(config)
        runs = load_registry(box.config.with_name("pasted.toml")).runs  # runbot starts on it
        assert runs["train.lab.example"].container == 210 and runs["train.lab.example"].log == str(box.logs[210])
        [odd] = [r for r in runs.values() if r.container == 211]  # the quoted path; the other two commented out
        assert odd.log == "/data/it's \"q\" `x` \\back.log"


async def _slack_discover(box, text: str) -> str:
    """/run discover as Alice asks it: the code Slack shows, as a user copies it (entities read back)."""
    targets = Targets(box.registry)
    services = Services(targets, box.registry, chat=ChatUpdates())
    try:
        reply, _, _ = await dispatch(services, "U0ALICE", "C0TEAM", text)
    finally:
        await targets.close()
    assert reply.in_channel is False  # `here` or not: it lists every CT's command lines
    said = [b["elements"][0]["text"] for b in reply.blocks if b["type"] == "context"]
    assert "answered only to you: discovery shows every CT's command lines" in said
    code = slack_code({"blocks": reply.blocks})
    assert all(line.endswith('"') for line in code.splitlines() if line.startswith(("log = ", "# log = ")))  # none cut
    return code


def test_20000_compute_processes_are_read_in_one_pass(box, capsys):
    pids = [100_000 + i for i in range(20_000)]
    box.apps([f"{pid}, GPU-{pid % 8}, 10" for pid in pids])
    root = box.tmp / "proc"
    for pid in pids[:4]:
        (root / str(pid)).mkdir(parents=True)
        (root / str(pid) / "cgroup").write_text("12:memory:/lxc/200/ns\n11:cpu:/lxc/200/ns\n0::/lxc/200/ns\n")
    # Below /lxc/201/ns/ CT 201's root names the cgroups: one whose name holds a line break and a `# pid`.
    (root / str(pids[3]) / "cgroup").write_text(f"0::/lxc/201/ns/x\n# pid {pids[0]}\n0::/lxc/999/ns\n")
    started = time.monotonic()
    view = probe(box, discover=False, proc_root=str(root))
    took = time.monotonic() - started
    assert view.failure is None, view.failure
    assert len(view.apps) == APPS_MAX and view.apps_cut
    assert [a.vmid for a in view.apps[:5]] == [200, 200, 200, 201, None]  # CT 201 renamed no other process
    with capsys.disabled():
        print(f"\n  20,000 compute processes: {took:.2f} s (connection included)")
    assert took < 5, took  # one `head` per row ran past the probe's 30 s
    assert f"(nvidia-smi on pve1 lists over {APPS_MAX} compute processes: the first {APPS_MAX} are read)" \
        in host_lines(view, [])


def test_the_bot_stops_reading_an_answer_past_its_bound_over_ssh_and_here(box):
    async def go():
        targets = Targets(box.registry)
        try:
            runner = targets.host_runner("pve1")
            flood = await runner.run("yes | head -c 200000000", timeout=20, limit=1 << 20)
            after = await runner.run("echo still here", timeout=20)  # the connection and its slot are fine
            return flood, after
        finally:
            await targets.close()
    flood, after = asyncio.run(go())
    assert flood.failure is None and flood.truncated and len(flood.stdout) == 1 << 20
    assert after.stdout == b"still here\n" and not after.truncated
    local = asyncio.run(LocalRunner().run("yes | head -c 200000000", timeout=20, limit=1 << 20))
    assert local.failure is None and local.truncated and len(local.stdout) == 1 << 20


def test_a_host_whose_answer_floods_is_read_to_the_bound_and_says_so(box):
    # Not a CT: the host's own `pct list` printing 40 MB after its list (the host's caps are not the bot's only one).
    pct = box.bin / "pct"
    pct.write_text(f"#!/bin/bash\n[ \"$1\" = list ] || exec {PCT_BIN}/pct \"$@\"\n{PCT_BIN}/pct list\n"
                   "head -c 40000000 /dev/zero | tr '\\0' x\n")
    pct.chmod(0o755)
    box.srv.set_ct(200, "running", "train-7b")
    out, peak = cli_with_peak_rss("--config", str(box.config), "discover", "pve1")
    assert out.returncode == 0, out.stderr
    assert peak < RSS_LIMIT, peak
    assert f"# the host's answer passed {HOST_ANSWER_BYTES >> 20} MiB: runbot read no further" in out.stdout
    assert "# CT 200 train-7b: not read (the answer was cut before it)" in out.stdout
