"""Machine-readable answers: `--json` (every key documented in docs/json.md, and each documented key emitted),
cleaned as the terminal's text is, and `status --check` as a monitoring plugin — through the real CLI."""

from __future__ import annotations

import json
import math
import re
import sqlite3
from pathlib import Path

import pytest

from bot.core.diagnose import unreachable as fail
from bot.core.facts import Crash, Kind, Process, Step
from bot.core.gpus import classify, parse_gpu_section
from bot.core.ledger import Incident
from bot.core.redact import clean_line
from bot.core.timeline import Span
from bot.core.verdict import Concern, Finding, Found, Level, Phase, Trend, Verdict, Worry
from bot.core.facts import WindowGap
from bot.render import machine, plugin
from config.registry import Run
from tests.builders import evidence, gpu_section
from tests.standins import REAL_FIXTURES, REPO, fake_nvidia_smi, writer_holding
from tests.test_cli import runbot

DOC = (REPO / "docs" / "json.md").read_text()
TOKEN = "hf_abcdefghijklmnopqrstuvwxyz0123456789"
ROLES = (("target", (0, 1)), ("drafter", (2, 3)))


def documented() -> dict[str, set[str]]:
    """{schema: the field paths its table lists} from docs/json.md's `## \\`runbot.x/1\\`` sections."""
    out: dict[str, set[str]] = {}
    for head, body in re.findall(r"^## `(runbot\.[a-z]+/\d+)`\n(.*?)(?=^## |\Z)", DOC, re.M | re.S):
        out[head] = set(re.findall(r"^\| `([^`]+)` \|", body, re.M))
    return out


def paths(value: object, prefix: str = "") -> set[str]:
    """Every key path of a JSON value: `writer.pid`, `gpu.roles[].busy` (lists of objects as `[]`)."""
    out: set[str] = set()
    if isinstance(value, dict):
        for key, child in value.items():
            path = f"{prefix}.{key}" if prefix else key
            out |= {path} | paths(child, path)
    elif isinstance(value, list):
        for item in value:
            if isinstance(item, dict):
                out |= paths(item, f"{prefix}[]")
    return out


def rich() -> Verdict:
    """A verdict with every optional part filled, so every key the renderer can emit is emitted."""
    readings = parse_gpu_section(gpu_section([[(0, 70000, 99), (1, 70000, 97), (2, 30000, 0), (3, 400, 0), (4, 9000, 55)]]))
    return Verdict(
        run="dflash", phase=Phase.TRAINING, level=Level.WARN, headline=f"training, drafter idle \x1b[31m{TOKEN}\x1b[0m",
        step=Step("step=1200", step=1200, total=50_000, loss=math.nan, rate=14213.0, rate_unit="tok/s", epoch=1.5,
                  non_finite=("loss",)),
        progress_age=4.0, silent_for=3.0, log_size=123_456, threshold=600.0,
        writer=Process(692, 3600, f"python3 train.py --token {TOKEN} " + "x" * 900),
        process=Process(700, 10, "python3 other.py"), hidden_processes=2,
        crash=Crash(Kind.OOM, "torch.OutOfMemoryError", "CUDA out of memory", rank=3, exit_code=-9),
        thread_crash=Crash(Kind.TRACEBACK, "RuntimeError", "boom", thread="drafter-1"),
        findings=(Found(Finding.IDLE_ROLE, "drafter"),), trend=Trend(eta=3600.0, vs_median=-0.12),
        gpu=classify(readings, dict(ROLES)), concerns=(Concern(Worry.GPU_IDLE, "drafter"),),
        problems=("steps: timed out",), observed_at=1_796_000_000.0)


def history_answer() -> dict:
    spans = [Span(1.0, 2.0, Phase.TRAINING, 0, 1, 9, 100.0, "it/s", False)]
    incidents = [Incident("dflash", 1, "C1", "1.1", 1.5, Concern(Worry.SILENT)), Incident("dflash", 2, "C1", None, 1.8)]
    return machine.history("dflash", spans, incidents, 10.0, 9.0)


def answers() -> dict[str, list[dict]]:
    v = rich()
    unreachable = fail(Run(name="x", host="h", container=None, log="/x.log"), "h refused the connection", "unreachable")
    return {machine.STATUS: [machine.status(v, where="pve1 CT 200 · /train.log"), machine.status(unreachable)],
            machine.GPUS: [machine.gpus(v)], machine.RUNS: [machine.runs([("dflash", v), ("x", unreachable)])],
            machine.HISTORY: [history_answer()]}


def test_every_key_the_renderer_emits_is_documented_and_every_documented_key_is_emitted():
    docs = documented()
    assert set(docs) == {machine.STATUS, machine.GPUS, machine.RUNS, machine.HISTORY}
    for schema, outs in answers().items():
        emitted = set().union(*(paths(o) for o in outs))
        if schema == machine.RUNS:  # its entries are status objects, documented once
            entries = {p.removeprefix("runs[].") for p in emitted if p.startswith("runs[].")}
            assert entries == docs[machine.STATUS] - {"schema"}
            emitted -= {p for p in emitted if p.startswith("runs[].")}
        assert emitted == docs[schema], (schema, emitted ^ docs[schema])
        assert all(o["schema"] == schema for o in outs)


@pytest.mark.parametrize("row, values", [
    ("phase", [p.name.lower() for p in Phase]),
    ("crash.kind", [k.value for k in Kind]),
    ("findings[].what", [f.value for f in Finding]),
    ("concerns[].kind", [w.value for w in Worry]),
    ("gpu.basis.gap", [g.name.lower() for g in WindowGap]),
])
def test_the_documented_words_are_the_codes_own(row, values):
    if row == "phase":  # listed once, in the versions section
        text = DOC.split("Phases are the phase's name", 1)[1].split("Levels,", 1)[0]
    else:
        text = next(line for line in DOC.splitlines() if line.startswith(f"| `{row}` |"))
    assert set(re.findall(r"`([a-z_]+)`", text)) - {row} == set(values)


def test_text_is_cleaned_exactly_as_the_terminal_cleans_it_and_no_nan_is_written():
    out = machine.status(rich())
    assert out["headline"] == clean_line(rich().headline) and TOKEN not in json.dumps(out) and "\x1b" not in out["headline"]
    assert "hf_[redacted]" in out["headline"] and "hf_[redacted]" in out["writer"]["command"]
    assert len(out["writer"]["command"]) == machine.COMMAND_CHARS and out["writer"]["command"].endswith("…")
    assert out["loss"] is None and out["non_finite"] == ["loss"]
    json.dumps(out, allow_nan=False)  # valid JSON: no NaN anywhere


def test_gpu_classes_by_role_with_the_gpus_of_no_role_last():
    roles = machine.status(rich())["gpu"]["roles"]
    assert [r["role"] for r in roles] == ["target", "drafter", None]
    target, drafter, other = roles
    assert target["busy"] == [0, 1] and target["busy_share"] == 1.0 and target["mem_used_gib"] == pytest.approx(136.72, abs=0.01)
    assert drafter["idle"] == [2, 3] and drafter["memory_held"] == [2] and drafter["busy_share"] == 0.0
    assert other["gpus"] == [4]


# -- --check: the plugin's exit code and line ---------------------------------------------------------------


@pytest.mark.parametrize("level, phase, code", [
    (Level.OK, Phase.TRAINING, plugin.OK),
    (Level.NOTE, Phase.SAVING, plugin.OK),  # a checkpoint is work, not a warning
    (Level.NOTE, Phase.LOADING, plugin.OK),
    (Level.WARN, Phase.THREAD_DIED, plugin.WARNING),
    (Level.CRIT, Phase.CRASHED, plugin.CRITICAL),
    (Level.CRIT, Phase.SILENT, plugin.CRITICAL),
    (Level.CRIT, Phase.UNREACHABLE, plugin.UNKNOWN),  # nothing was seen: the check cannot tell
])
def test_each_level_has_its_plugin_exit_code(level, phase, code):
    assert plugin.code(Verdict("r", phase, level, "x")) == code


def test_the_plugin_line_has_its_headline_on_one_line_and_perfdata_per_the_guidelines():
    status, line = plugin.check(rich())
    assert status == plugin.WARNING
    head, perf = line.split(" | ")
    assert head.startswith("RUNBOT WARN - training, drafter idle hf_[redacted]") and "\n" not in line
    assert perf.split() == ["step=1200;;;0;50000", "rate=14213;;;;", "age=4s;;;;", "busy_target=100%;;;0;100",
                            "busy_drafter=0%;;;0;100"]  # no loss: NaN is not a number to graph
    bare = plugin.check(Verdict("r", Phase.CRASHED, Level.CRIT, "a | b\nc"))[1]
    assert bare == "RUNBOT CRIT - a / b c"  # `|` would start perfdata; nothing read, no perfdata


@pytest.mark.parametrize("x, written", [(1e-07, "0.0000001"), (14213.0, "14213"), (2.31, "2.31"), (1200, "1200"),
                                        (1.5e20, "150000000000000000000")])
def test_perfdata_numbers_are_positional(x, written):
    assert plugin.perfdata(Verdict("r", Phase.TRAINING, Level.OK, "x", step=Step("", rate=x))) == f"rate={written};;;;"


# -- the real CLI ---------------------------------------------------------------------------------------------


SMI = "0, 70000, 143771, 99\n1, 30000, 143771, 95\n"


@pytest.fixture
def config(tmp_path: Path) -> Path:
    (tmp_path / "oom.log").write_bytes((REAL_FIXTURES / "train_oom.log").read_bytes())
    (tmp_path / "ok.log").write_bytes((REAL_FIXTURES / "train_ok.log").read_bytes())
    (tmp_path / "live.log").write_text(f"step=41 loss=2.25 tok/s=14100\nstep=42 loss=2.21 tok/s=14200 {TOKEN}\n")
    (tmp_path / "load.log").write_text("Loading checkpoint shards:  50%|█████     | 1/2 [00:10<00:10,  1.00s/it]\n")
    (tmp_path / "thread.log").write_text(
        "step=1 loss=2.0 tok/s=100\nException in thread drafter-1:\nTraceback (most recent call last):\n"
        '  File "x.py", line 1, in run\nRuntimeError: boom\nstep=2 loss=1.9 tok/s=100\n')
    (tmp_path / "leak.log").write_text("step=1 loss=2.0\nTraceback (most recent call last):\n  File \"x.py\", line 1\n"
                                       f"RuntimeError: \x1b[31mlogin failed\x1b[0m for {TOKEN}\n")
    fake_nvidia_smi(tmp_path / "bin", [SMI])
    path = tmp_path / "runs.toml"
    path.write_text(
        '[bot]\nstate_db = "state.db"\n[defaults]\ngpu_samples = 1\nsilence_after = "1h"\n'
        '[runs.live]\nhost = "local"\nlog = "live.log"\n[runs.live.gpus]\ntarget = [0]\ndrafter = [1]\n'
        '[runs.ok]\nhost = "local"\nlog = "ok.log"\n'
        '[runs.oom]\nhost = "local"\nlog = "oom.log"\n'
        '[runs.load]\nhost = "local"\nlog = "load.log"\n'
        '[runs.thread]\nhost = "local"\nlog = "thread.log"\n'
        '[runs.gone]\nhost = "local"\nlog = "missing.log"\n'
        '[runs.leak]\nhost = "local"\nlog = "leak.log"\n'
        '[hosts.down]\naddress = "127.0.0.1"\nport = 1\nconnect_timeout = "2s"\n'
        '[runs.far]\nhost = "down"\nlog = "/x.log"\n')
    return path


def cli(config: Path, *args: str, **env: str):
    return runbot("--config", str(config), *args, env={"PATH": f"{config.parent / 'bin'}:/usr/bin:/bin", **env})


def test_status_json_through_the_real_cli(config):
    with writer_holding(config.parent / "live.log"):
        out = cli(config, "status", "live", "--json")
    assert out.returncode == 0, out.stderr
    answer = json.loads(out.stdout)
    assert answer["schema"] == "runbot.status/1" and answer["run"] == "live"
    assert (answer["level"], answer["phase"], answer["step"], answer["rate"], answer["rate_unit"], answer["loss"]) == \
        ("ok", "training", 42, 14200.0, "tok/s", 2.21)
    assert TOKEN not in out.stdout
    assert answer["writer"]["pid"] > 0
    target, drafter = answer["gpu"]["roles"]
    assert (target["role"], target["busy"], drafter["role"], drafter["busy"]) == ("target", [0], "drafter", [1])


def test_json_text_is_redacted_and_cleaned_as_the_terminal_answer_is(config):
    text, answer = cli(config, "status", "leak"), cli(config, "status", "leak", "--json")
    assert TOKEN not in text.stdout + answer.stdout and "\x1b" not in answer.stdout
    assert json.loads(answer.stdout)["headline"] == text.stdout.splitlines()[0]
    assert "hf_[redacted]" in json.loads(answer.stdout)["crash"]["message"]


def test_gpus_runs_and_history_json_through_the_real_cli(config):
    gpus = cli(config, "gpus", "live", "--json")
    assert gpus.returncode == 0, gpus.stderr
    detail = json.loads(gpus.stdout)["gpu"]["gpus"]
    assert [(g["index"], g["role"], g["class"]) for g in detail] == [(0, "target", "busy"), (1, "drafter", "busy")]
    runs = cli(config, "runs", "--json", RUNBOT_STATE_DB=str(config.parent / "state.db"))
    assert runs.returncode == 0, runs.stderr
    listed = json.loads(runs.stdout)["runs"]
    assert listed[0]["level"] == "crit" and {r["run"] for r in listed} == {"live", "ok", "oom", "load", "thread", "gone", "leak", "far"}
    assert next(r for r in listed if r["run"] == "far")["reached"] is False
    history = cli(config, "history", "oom", "--json")  # the runs probe above added to the memory
    assert history.returncode == 0, history.stderr
    told = json.loads(history.stdout)
    assert told["schema"] == "runbot.history/1" and [s["phase"] for s in told["spans"]] == ["crashed"]
    text = cli(config, "history", "oom", "2h")
    assert text.returncode == 0 and text.stdout.startswith("oom: crashed since") and "phases" in text.stdout


def test_history_without_a_state_file_or_with_a_bad_window_exits_2(config):
    out = cli(config, "history", "ok")
    assert out.returncode == 2 and "no state file" in out.stderr
    sqlite3.connect(config.parent / "state.db").close()
    assert cli(config, "history", "ok", "6").returncode == 2


@pytest.mark.parametrize("run, code, word", [
    ("live", 0, "OK"), ("ok", 0, "OK"), ("load", 0, "OK"), ("thread", 1, "WARN"), ("oom", 2, "CRIT"), ("gone", 2, "CRIT"),
    ("far", 3, "UNKNOWN"), ("nope", 3, "UNKNOWN"),
])
def test_check_exits_as_a_monitoring_plugin_with_one_line(config, run, code, word):
    with writer_holding(config.parent / "live.log"), writer_holding(config.parent / "load.log"), \
            writer_holding(config.parent / "thread.log"):
        out = cli(config, "status", run, "--check")
    assert out.returncode == code, (out.stdout, out.stderr)
    assert len(out.stdout.splitlines()) == 1 and out.stdout.startswith(f"RUNBOT {word} - ")
    if run == "live":
        assert out.stdout.split(" | ")[1].split()[:2] == ["step=42;;;;", "rate=14200;;;;"]


def test_check_with_bad_arguments_or_a_bad_config_is_unknown(config, tmp_path):
    assert cli(config, "status", "--check").returncode == 3
    bad = tmp_path / "bad.toml"
    bad.write_text("[runs.x]\nhost = 3\n")
    out = runbot("--config", str(bad), "status", "x", "--check")
    assert out.returncode == 3 and out.stdout.startswith("RUNBOT UNKNOWN - bad configuration")
    assert cli(config, "status", "ok", "--check", "--json").returncode == 3  # one or the other
