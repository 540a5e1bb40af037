"""runbot on the Proxmox node itself: `host = "local"` with `container` enters the CT with a local `pct exec`
(issue 22 #2), with pct's failures read as over SSH. `pct` is the tests' stand-in (bot/demo/lab/bin/pct)."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path

import pytest

from bot.core.verdict import Phase
from bot.probe.checkup import check
from bot.probe.runners import LocalRunner
from bot.probe.targets import Targets
from config.registry import ConfigError, faults_of, parse_registry
from tests.host_standins import hostile_ct
from tests.sshd import PCT_BIN
from tests.standins import writer_holding


@pytest.fixture
def node(tmp_path: Path) -> dict[str, str]:
    """This machine as a Proxmox node: the pct stand-in on PATH, CT 200 running, CT 201 stopped."""
    state = tmp_path / "pct"
    state.mkdir()
    (state / "200.running").write_text("train-7b")
    (state / "201.stopped").write_text("old")
    return {"PATH": f"{PCT_BIN}:/usr/local/bin:/usr/bin:/bin", "PCT_STATE_DIR": str(state)}


def registry(tmp_path: Path, body: str):
    path = tmp_path / "runs.toml"
    path.write_text(body)
    return parse_registry(body, path)


def run_in(tmp_path: Path, ct: int, log: Path):
    return registry(tmp_path, f'[runs.x]\nhost = "local"\ncontainer = {ct}\nlog = "{log}"\n').runs["x"]


def test_the_script_runs_inside_the_ct_through_pct_exec(node: dict[str, str], tmp_path: Path) -> None:
    result = asyncio.run(LocalRunner(node, container=200).run("echo inside; echo \"$PCT_STATE_DIR\" >&2", timeout=10))
    assert (result.failure, result.stdout, result.exit_status) == (None, b"inside\n", 0)


@pytest.mark.parametrize("ct, said", [
    (201, "container 201 is stopped on this machine"),
    (999, "container 999 is not on this machine (pct has no config for it there)"),
])
def test_pct_failures_are_verdicts_naming_this_machine(node: dict[str, str], ct: int, said: str) -> None:
    result = asyncio.run(LocalRunner(node, container=ct).run("echo inside", timeout=10))
    assert (result.failure, result.failure_kind) == (said, "container")


def test_no_pct_here_says_so(tmp_path: Path) -> None:
    result = asyncio.run(LocalRunner({"PATH": str(tmp_path)}, container=200).run("echo inside", timeout=10))
    assert result.failure_kind == "container" and result.failure.startswith("`pct` was not found on this machine")


def test_a_local_ct_run_is_probed_in_its_ct_not_on_the_node(node: dict[str, str], tmp_path: Path) -> None:
    """The CT was silently dropped before: the node's own disk was read, "log not found"."""
    log = tmp_path / "train.log"
    log.write_text("step=12 loss=2.31 tok/s=14213\n")
    targets = Targets(registry(tmp_path, ""), local_env=node)
    with writer_holding(log):
        running = asyncio.run(check(run_in(tmp_path, 200, log), targets.runner_for(run_in(tmp_path, 200, log))))
    stopped = asyncio.run(check(run_in(tmp_path, 201, log), targets.runner_for(run_in(tmp_path, 201, log))))
    assert running.phase is Phase.TRAINING and "step 12" in running.headline
    assert "container 201 is stopped on this machine" in stopped.headline
    assert targets.runner_for(run_in(tmp_path, 200, log)) is targets.runner_on("local", 200)  # one per CT


def test_a_log_inside_a_local_ct_needs_an_absolute_path(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as caught:
        registry(tmp_path, '[runs.x]\nhost = "local"\ncontainer = 200\nlog = "train.log"\n')
    assert [(f.key, f.fault) for f in faults_of(caught.value)] == [
        ("runs.x.log", 'relative path "train.log" in CT 200 (a log inside a container needs an absolute path)')]
    assert registry(tmp_path, '[runs.x]\nhost = "local"\nlog = "train.log"\n').runs["x"].log == str(tmp_path / "train.log")


def test_check_config_says_the_ct_is_entered_on_this_machine(tmp_path: Path, capsys) -> None:
    from bot.cli import main

    path = tmp_path / "runs.toml"
    path.write_text('[runs.x]\nhost = "local"\ncontainer = 200\nlog = "/workspace/train.log"\n')
    assert main(["--config", str(path), "check-config"]) == 0
    assert "run x: local CT 200 · /workspace/train.log (pct exec on this machine)" in capsys.readouterr().out


FLOOD = """
import asyncio, json, sys
from bot.probe.checkup import check
from bot.probe.replay import DefaultRun
from bot.probe.runners import LocalRunner
from tests.standins import peak_rss_bytes
env = json.loads(sys.argv[1])
verdict = asyncio.run(check(DefaultRun("x", "/workspace/train.log"), LocalRunner(env, container=200), timeout=60))
print(json.dumps({"headline": verdict.headline, "phase": verdict.phase.value,
                  "rss_mib": peak_rss_bytes() / 2**20}))
"""


def test_a_ct_whose_bash_floods_the_run_probe_costs_a_bounded_read(node: dict[str, str], tmp_path: Path) -> None:
    """In a CT, `bash` is the tenant's: 300 MB on stdout must stop at the probe's bound, not fill the bot (issue 19 #1)."""
    hostile_ct(Path(node["PCT_STATE_DIR"]), 200, "train-7b", "head -c 300000000 /dev/zero | tr '\\\\0' x\n")
    done = subprocess.run([sys.executable, "-c", FLOOD, json.dumps(node)], capture_output=True, text=True, timeout=120,
                          cwd=Path(__file__).resolve().parent.parent)
    said = json.loads(done.stdout)
    assert said["phase"] == "unreachable" and "answer passed 1.2 MiB and was cut" in said["headline"], said
    assert said["rss_mib"] < 150, said
