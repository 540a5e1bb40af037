"""`runbot status|gpus|tail|runs` for runs on an SSH host, through a real sshd and the pct stand-in."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pytest

from tests.sshd import SKIP_REASON, SshLab, have_sshd
from tests.standins import REAL_FIXTURES, writer_holding
from tests.test_cli import runbot

pytestmark = pytest.mark.skipif(not have_sshd(), reason=SKIP_REASON)


def ssh_config(tmp_path: Path, lab: SshLab, srv, more: Sequence[tuple[str, int]] = ()) -> tuple[Path, Path]:
    """runs.toml for the lab's host pve1: run `dflash` in its running CT 200, a real log up to step 10 (no writer
    yet), and a run per (name, container) in `more` on the same log. Returns (config, log)."""
    srv.set_ct(200, "running")
    log = tmp_path / "train.log"
    real = (REAL_FIXTURES / "train_ok.log").read_bytes()
    log.write_bytes(real[: real.index(b"step=12 ")])
    config = tmp_path / "runs.toml"
    config.write_text(
        f'[hosts.pve1]\naddress = "127.0.0.1"\nport = {srv.port}\nuser = "{lab.user}"\n'
        f'key = "{lab.client_key}"\nknown_hosts = "{lab.known_hosts}"\nconnect_timeout = "5s"\n'
        '[defaults]\ngpu_samples = 1\n'
        + "".join(f'[runs.{name}]\nhost = "pve1"\ncontainer = {ct}\nlog = "{log}"\n' for name, ct in (("dflash", 200), *more))
    )
    return config, log


@pytest.fixture
def cluster(tmp_path: Path):
    lab = SshLab(tmp_path / "lab")
    srv = lab.sshd("pve1")
    srv.set_ct(201, "stopped")
    yield ssh_config(tmp_path, lab, srv, (("stopped", 201), ("gone", 999)))
    lab.close()


def test_status_over_ssh_reads_like_local(cluster):
    config, log = cluster
    with writer_holding(log):
        out = runbot("--config", str(config), "status", "dflash")
    assert out.returncode == 0, out.stdout + out.stderr
    assert out.stdout.startswith("step 10 · 41.3K tok/s · loss 10.77")
    assert "pve1 CT 200" in out.stdout


def test_tail_over_ssh(cluster):
    config, _ = cluster
    out = runbot("--config", str(config), "tail", "dflash", "-n", "2")
    assert out.returncode == 0
    assert out.stdout.splitlines()[1:] == [
        "step=8 loss=10.7978 tok/s=41234 elapsed=5.8s", "step=10 loss=10.7731 tok/s=41265 elapsed=6.6s"]


@pytest.mark.parametrize("run, words", [
    ("stopped", "container 201 is stopped"),
    ("gone", "container 999 is not on host pve1"),
])
def test_container_faults_exit_3_in_words(cluster, run, words):
    config, _ = cluster
    out = runbot("--config", str(config), "status", run)
    assert out.returncode == 3
    assert words in out.stdout.splitlines()[0]


def test_runs_mixes_healthy_and_unreachable(cluster):
    config, _ = cluster
    out = runbot("--config", str(config), "runs")
    assert out.returncode == 0
    rows = dict(line.split(None, 1) for line in out.stdout.splitlines())
    assert "container 201 is stopped" in rows["stopped"]
    assert "container 999 is not on host pve1" in rows["gone"]
