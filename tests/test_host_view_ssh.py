"""The host's view end to end: a real sshd, `pct` entering real PID namespaces, a host nvidia-smi naming the
PIDs of real processes, and those PIDs mapped to their CTs through real cgroups (or a laid-out proc root)."""

from __future__ import annotations

import asyncio
import contextlib
import time
from pathlib import Path

import pytest

from bot.probe.scheduler import Scheduler
from bot.probe.targets import Targets
from bot.service.app import Services
from bot.service.host_view import discover_lines, host_lines
from config.registry import load_registry
from bot.render.slack import ACTION_GPUS
from handlers import actions
from handlers.commands import dispatch
from tests.host_standins import can_make_namespaces, ct_namespaces, fake_host_smi, gpu_row, lxc_cgroups
from tests.sshd import SKIP_REASON, SshLab, have_sshd
from tests.test_cli import runbot

pytestmark = [pytest.mark.skipif(not have_sshd(), reason=SKIP_REASON),
              pytest.mark.skipif(not can_make_namespaces(), reason="CTs as PID namespaces need root and unshare")]


class Box:
    """A Proxmox node on 127.0.0.1: the sshd, its pct state, its nvidia-smi, and a runs.toml for it."""

    def __init__(self, tmp: Path, *, host_view: bool = True, key: Path | None = None,
                 tmpdir: Path | None = None) -> None:
        self.tmp = tmp
        self.lab = SshLab(tmp / "lab")
        self.bin = tmp / "hostbin"
        fake_host_smi(self.bin, [gpu_row(i, f"GPU-{i}", util=10 * i) for i in range(8)])
        self.srv = self.lab.sshd("pve1", extra_bin=self.bin, tmpdir=tmpdir)
        self.logs = {vmid: tmp / f"ct{vmid}" / "train.log" for vmid in range(200, 240)}
        for log in self.logs.values():
            log.parent.mkdir()
        self.config = tmp / "runs.toml"
        self.config.write_text(
            "[access]\nusers = [\"U0ALICE\", \"U0BOB\"]\n"
            f'[hosts.pve1]\naddress = "127.0.0.1"\nport = {self.srv.port}\nuser = "{self.lab.user}"\n'
            f'key = "{key or self.lab.client_key}"\nknown_hosts = "{self.lab.known_hosts}"\nconnect_timeout = "5s"\n'
            f"host_view = {'true' if host_view else 'false'}\n"
            "[defaults]\ngpu_samples = 1\n"
            f'[runs.train-7b]\nhost = "pve1"\ncontainer = 200\nlog = "{self.logs[200]}"\n'
            "[runs.train-7b.gpus]\ntrain = [4, 5]\n"
            f'[runs.eval-7b]\nhost = "pve1"\ncontainer = 201\nlog = "{self.logs[201]}"\n'
            f'[runs.secret]\nhost = "pve1"\ncontainer = 203\nlog = "{self.logs[203]}"\nusers = ["U0ALICE"]\n')
        self.registry = load_registry(self.config)

    def apps(self, rows: list[str]) -> None:
        fake_host_smi(self.bin, [gpu_row(i, f"GPU-{i}", util=10 * i) for i in range(8)], rows)

    def close(self) -> None:
        self.lab.close()


@pytest.fixture
def box(tmp_path):
    b = Box(tmp_path)
    yield b
    b.close()


@contextlib.contextmanager
def mapped(box: Box, cts, *, seam: bool = False):
    """The CTs' training PIDs in real lxc/<vmid> cgroups where this machine lets a test make them; else (or
    asked for the seam) a proc root laid out with the same cgroup lines. Yields (which ran, the proc_root)."""
    with (contextlib.nullcontext(None) if seam else lxc_cgroups({ct.vmid: [ct.train_pid] for ct in cts})) as how:
        if how is not None:
            yield how, "/proc"
            return
        root = box.tmp / "proc"
        for ct in cts:
            (root / str(ct.train_pid)).mkdir(parents=True)
            (root / str(ct.train_pid) / "cgroup").write_text(f"0::/lxc/{ct.vmid}/ns/init.scope\n")
        yield "laid-out proc root" + ("" if seam else " (no cgroup could be made here)"), str(root)


def test_the_proc_root_seam_maps_pids_as_the_real_cgroups_do(box):
    with ct_namespaces(box.srv.pct_state, [(200, "train", box.logs[200])]) as cts:
        box.apps([f"{cts[0].train_pid}, GPU-4, 2048", "999999, GPU-5, 10"])  # a PID with no cgroup file: no CT
        with mapped(box, cts, seam=True) as (how, proc_root):
            view = probe(box, discover=False, proc_root=proc_root)
    assert how == "laid-out proc root"
    assert {a.pid: a.vmid for a in view.apps} == {cts[0].train_pid: 200, 999999: None}
    assert view.scans == {}  # no discovery asked: no CT entered


class ChatUpdates:
    """Where the GPUs button's chat.update goes: kept to be read (Slack itself is not this test's subject)."""

    def __init__(self) -> None:
        self.updated: list[dict] = []

    async def chat_update(self, **kw) -> None:
        self.updated.append(kw)


def probe(box: Box, *, discover: bool, proc_root: str = "/proc"):
    async def go():
        targets = Targets(box.registry)
        try:
            return await Scheduler(box.registry, targets).host_view("pve1", discover=discover, proc_root=proc_root)
        finally:
            await targets.close()
    return asyncio.run(go())


def test_discovery_and_gpu_ownership_on_real_processes(box, capsys):
    box.srv.set_ct(230, "stopped", "old")
    cts_spec = [(200, "train-7b", box.logs[200]), (201, "eval", box.logs[201]), (202, "llama-13b", box.logs[202]),
                (204, "idle", None)]
    with ct_namespaces(box.srv.pct_state, cts_spec) as cts:
        pid = {ct.vmid: ct.train_pid for ct in cts}
        box.apps([f"{pid[200]}, GPU-4, 61440", f"{pid[200]}, GPU-5, 61440", f"{pid[201]}, GPU-5, 38912",
                  f"{pid[202]}, GPU-6, 1024"])
        with mapped(box, cts[:3]) as (how, proc_root):
            with capsys.disabled():
                print(f"\n  PID -> CT mapping proved through: {how}")
            view = probe(box, discover=True, proc_root=proc_root)
    assert view.failure is None, view.failure
    assert {a.pid: a.vmid for a in view.apps} == {pid[200]: 200, pid[201]: 201, pid[202]: 202}
    # Inside its CT a process has its CT's PIDs, not the host's: the scan saw it under its own.
    assert all(p.pid < 10 for scan in view.scans.values() for p in scan.procs)
    text = "\n".join(discover_lines(box.registry, view))
    assert "# already configured as [runs.train-7b]: CT 200" in text
    assert "# already configured as [runs.eval-7b]: CT 201" in text
    assert f'[runs.llama-13b]  # CT 202 llama-13b' in text
    assert f'log = "{box.logs[202]}"' in text and "gpus = { train = [6] }" in text
    assert f'# also written: "{box.logs[202]}.ckpt"' in text
    assert "# CT 204 idle: no training process found" in text
    assert "230" not in text  # stopped: not entered
    lines = host_lines(view, box.registry.runs.values())
    assert lines[0] == "pve1: 8 GPUs · 4 of 5 CTs running"
    assert "GPU 5: 0/140 GiB    util 50 %  CT 200 (run `train-7b`, 60 GiB), CT 201 (run `eval-7b`, 38 GiB)" in lines
    assert "GPU 0: 0/140 GiB    util 0 %   free" in lines


def test_discovery_of_20_cts_is_one_round_trip_under_2_s(box, capsys):
    spec = [(vmid, f"job-{vmid}", box.logs[vmid]) for vmid in range(210, 230)]
    with ct_namespaces(box.srv.pct_state, spec) as cts:
        box.apps([f"{ct.train_pid}, GPU-{i % 8}, 1000" for i, ct in enumerate(cts)])

        async def go():
            targets = Targets(box.registry)
            scheduler = Scheduler(box.registry, targets)
            try:
                started = time.monotonic()
                view = await scheduler.host_view("pve1", discover=True)
                return view, time.monotonic() - started, scheduler.probed, targets._pool.stats()
            finally:
                await targets.close()
        view, took, probes, stats = asyncio.run(go())
    with capsys.disabled():
        print(f"\n  discovery of 20 CTs: {took:.2f} s (connection included), {probes} probe")
    assert view.failure is None, view.failure
    assert len(view.scans) == 20 and all(s.error is None for s in view.scans.values())
    found = [f for f in discover_found(box, view) if f.configured_as is None]
    assert sorted(f.vmid for f in found) == list(range(210, 230))
    assert probes == 1  # one command over one connection: the scans fan out on the host, not from here
    assert took < 2.0


def discover_found(box, view):
    from bot.core.host_view import discovered
    return discovered(view, [(r.name, r.host, r.container, r.log) for r in box.registry.runs.values()])


@pytest.mark.parametrize("hierarchy", ["cgroup v2", "cgroup v1"])
def test_each_cgroup_spelling_on_a_real_process(box, hierarchy):
    with ct_namespaces(box.srv.pct_state, [(207, "train", box.logs[207])]) as cts:
        box.apps([f"{cts[0].train_pid}, GPU-3, 2048"])
        with lxc_cgroups({207: [cts[0].train_pid]}, only=hierarchy) as how:
            if how is None:
                pytest.skip(f"no {hierarchy} hierarchy where this machine lets a test make lxc/207")
            said = Path(f"/proc/{cts[0].train_pid}/cgroup").read_text()
            view = probe(box, discover=False)
    assert ("::/lxc/207" in said) if hierarchy.endswith("v2") else (":memory:/lxc/207" in said), said
    assert [(a.pid, a.vmid) for a in view.apps] == [(cts[0].train_pid, 207)]


def test_people_asking_about_one_box_at_once_share_one_look(box):
    box.srv.set_ct(200, "running")

    async def go():
        targets = Targets(box.registry)
        scheduler = Scheduler(box.registry, targets)
        try:
            views = await asyncio.gather(*(scheduler.host_view("pve1") for _ in range(10)))
            again = await scheduler.host_view("pve1")  # within FRESH_S: the same answer
            found = await scheduler.host_view("pve1", discover=True)  # another question: its own look
            return views, again, found, scheduler.probed
        finally:
            await targets.close()
    views, again, found, probed = asyncio.run(go())
    assert all(v is views[0] for v in views) and again is views[0] and views[0].failure is None
    assert found.scans and probed == 2


def test_cli_gpus_names_the_holders_and_host_shows_the_box(box):
    with ct_namespaces(box.srv.pct_state, [(200, "train", box.logs[200]), (201, "eval", box.logs[201])]) as cts:
        box.apps([f"{cts[0].train_pid}, GPU-4, 61440", f"{cts[0].train_pid}, GPU-5, 61440",
                  f"{cts[1].train_pid}, GPU-5, 38912"])
        with lxc_cgroups({ct.vmid: [ct.train_pid] for ct in cts}) as how:
            if how is None:
                pytest.skip("no cgroup can be made here: the CLI reads the real /proc (the seam is tested above)")
            gpus = runbot("--config", str(box.config), "gpus", "train-7b")
            host = runbot("--config", str(box.config), "host", "pve1")
    assert gpus.returncode == 0, gpus.stderr
    assert "  GPU 4: held by CT 200 (run `train-7b`, 60 GiB)" in gpus.stdout
    assert "  GPU 5 is also used by CT 201 (run `eval-7b`, 38 GiB)" in gpus.stdout
    assert host.returncode == 0, host.stderr
    assert "CT 201 (run `eval-7b`, 38 GiB)" in host.stdout


def test_cli_with_the_host_view_off_says_so_in_one_line(tmp_path):
    b = Box(tmp_path, host_view=False)
    try:
        gpus = runbot("--config", str(b.config), "gpus", "train-7b")
        host = runbot("--config", str(b.config), "discover", "pve1")
    finally:
        b.close()
    assert gpus.stdout.splitlines()[-1] == ("  host view: off for pve1 (set host_view = true under [hosts.pve1] to see "
                                            "which CT holds each GPU)")
    assert host.returncode == 2 and "host view: off for pve1" in host.stderr


def test_cli_says_when_the_host_refuses_the_view(box):
    box.apps([])
    fake_host_smi(box.bin, [], rc=4, said="Insufficient Permissions")
    gpus = runbot("--config", str(box.config), "gpus", "train-7b")
    assert "  host view not permitted on pve1: nvidia-smi failed (exit 4): Insufficient Permissions" in gpus.stdout


def test_cli_says_when_the_login_is_refused(tmp_path):
    from tests.sshd import keygen
    (tmp_path / "k").mkdir()
    b = Box(tmp_path, key=keygen(tmp_path / "k" / "stranger"))
    try:
        out = runbot("--config", str(b.config), "host", "pve1")
        unknown = runbot("--config", str(b.config), "host", "pve9")
    finally:
        b.close()
    assert out.returncode == 3
    assert out.stdout.startswith("pve1: 0 GPUs") and "host view not permitted on pve1" in out.stdout
    assert unknown.returncode == 2 and "unknown host 'pve9' (known: pve1)" in unknown.stderr


def test_slack_discover_and_host_for_access_only_and_hidden_runs_unnamed(box):
    with ct_namespaces(box.srv.pct_state, [(203, "secret", box.logs[203])]) as cts:
        box.apps([f"{cts[0].train_pid}, GPU-4, 1024"])
        with mapped(box, cts) as (how, _):
            if how.startswith("laid-out"):
                pytest.skip("no cgroup can be made here: the bot reads the real /proc")

            async def go():
                targets = Targets(box.registry)
                services = Services(targets, box.registry, chat=ChatUpdates())
                try:
                    said = {}
                    for user, text in (("U0ALICE", "discover pve1"), ("U0BOB", "discover pve1"),
                                       ("U0BOB", "host pve1"), ("U0BOB", "gpus train-7b"),
                                       ("U0EVE", "discover pve1"), ("U0BOB", "discover pve1; rm -rf /")):
                        reply, _, _ = await dispatch(services, user, "C0TEAM", text)
                        said[(user, text)] = reply
                    await actions._click(services, "U0BOB", "C0TEAM", "train-7b", actions.VIEWS[ACTION_GPUS][1],
                                         {"message_ts": "1796000042.000100"}, None)
                    return said, services.chat.updated[0]["text"]
                finally:
                    await targets.close()
            said, clicked = asyncio.run(go())
    assert "[runs.secret]" in said[("U0ALICE", "discover pve1")].text
    bob = said[("U0BOB", "discover pve1")].text
    assert "# CT 203: already configured" in bob and "secret" not in bob.replace("CT 203 secret", "")
    assert "GPU 4: 0/140 GiB    util 40 %  CT 203 (1 GiB)" in said[("U0BOB", "host pve1")].text
    assert "GPU 4 is used by CT 203 (1 GiB)" in said[("U0BOB", "gpus train-7b")].text  # `secret` stays unnamed
    assert said[("U0EVE", "discover pve1")].outcome == "refused"
    assert "GPU 4 is used by CT 203 (1 GiB)" in clicked  # the GPUs button says what /run gpus says
    assert said[("U0BOB", "discover pve1; rm -rf /")].outcome == "usage"  # two words: refused before anything runs
