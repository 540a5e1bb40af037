"""The command line as users meet it: real processes, real exit codes."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.standins import REPO, REAL_FIXTURES, writer_holding


def runbot(*args: str, env: dict | None = None, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "bot", *args], capture_output=True, text=True, timeout=120,
        # PYTHONPATH: this checkout's runbot even where cwd is elsewhere (an installed one may be older)
        env={**os.environ, "PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO), **(env or {})}, cwd=cwd or REPO,
    )


@pytest.fixture
def config(tmp_path: Path) -> Path:
    (tmp_path / "oom.log").write_bytes((REAL_FIXTURES / "train_oom.log").read_bytes())
    (tmp_path / "ok.log").write_bytes((REAL_FIXTURES / "train_ok.log").read_bytes())
    path = tmp_path / "runs.toml"
    path.write_text(
        '[defaults]\ngpu_samples = 1\n'
        '[runs.dflash-oom]\nhost = "local"\nlog = "oom.log"\n'
        '[runs.dflash-ok]\nhost = "local"\nlog = "ok.log"\n'
        '[runs.eagle]\nhost = "local"\nlog = "missing.log"\n'
    )
    return path


def test_status_first_line_is_the_verdict(config):
    out = runbot("--config", str(config), "status", "dflash-oom")
    assert out.returncode == 0, out.stderr
    first = out.stdout.splitlines()[0]
    assert first.startswith("crashed — torch.OutOfMemoryError: CUDA out of memory.")
    assert "nvidia-smi not found" in out.stdout  # said, not mistaken for idle GPUs


def test_a_unique_prefix_is_enough_and_the_config_comes_from_the_environment(config):
    out = runbot("status", "ea", env={"RUNBOT_CONFIG": str(config)})
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("log not found: ")


@pytest.mark.parametrize("args, words", [
    (("status", "nope"), 'unknown run "nope" (known: dflash-oom, dflash-ok, eagle)'),
    (("status", "dflash"), "dflash-oom, dflash-ok"),
    (("tail", "eagle", "-n", "500"), "N is a number of lines from 1 to 200"),
    (("tail", "eagle", "-n", "0"), "N is a number of lines from 1 to 200"),
    (("tail", "eagle", "0"), "N is a number of lines from 1 to 200"),
    (("tail", "eagle", "5", "-n", "6"), "N given twice"),
    (("status",), "required"),
    (("frobnicate",), "invalid choice"),
])
def test_bad_arguments_exit_2_and_say_why(config, args, words):
    out = runbot("--config", str(config), *args)
    assert out.returncode == 2
    assert words in out.stderr


def test_user_text_never_reaches_a_shell(config, tmp_path):
    out = runbot("--config", str(config), "status", "$(touch PWNED)", cwd=tmp_path)
    assert out.returncode == 2 and "unknown run" in out.stderr
    assert not (tmp_path / "PWNED").exists()


def test_a_bad_config_exits_2_naming_file_and_key(tmp_path):
    bad = tmp_path / "runs.toml"
    bad.write_text('[runs.x]\nhost = "local"\nlog = "/x.log"\nsilence_after = "10 minutes"\n')
    out = runbot("--config", str(bad), "runs")
    assert out.returncode == 2
    assert f"{bad}: runs.x.silence_after: bad duration" in out.stderr


def test_unreachable_exits_3_and_says_which_host(tmp_path):
    path = tmp_path / "runs.toml"
    kh = tmp_path / "known_hosts"
    kh.write_text("")
    path.write_text(
        f'[hosts.pve1]\naddress = "127.0.0.1"\nport = 9\nconnect_timeout = "2s"\nknown_hosts = "{kh}"\n'
        '[runs.far]\nhost = "pve1"\ncontainer = 200\nlog = "/workspace/train.log"\n'
    )
    out = runbot("--config", str(path), "status", "far")
    assert out.returncode == 3, out.stdout + out.stderr
    assert "pve1" in out.stdout.splitlines()[0]


def test_tail_collapses_bars_and_redacts(tmp_path):
    log = tmp_path / "train.log"
    log.write_bytes(
        b"HF_TOKEN=hf_abcdefghijklmnopqrstuvwxyz0123456789\n"
        b"\x1b[32mLoading\x1b[0m\rLoading weights:  50%|##   | 1/2 [00:01<00:01]\rLoading weights: 100%|####| 2/2 [00:02<00:00]\n"
        b"step=1 loss=2.0 tok/s=100\n"
    )
    path = tmp_path / "runs.toml"
    path.write_text(f'[runs.r]\nhost = "local"\nlog = "{log}"\ngpu_samples = 1\n')
    with writer_holding(log):
        out = runbot("--config", str(path), "tail", "r", "-n", "3")
    lines = out.stdout.splitlines()
    assert out.returncode == 0
    assert lines[1:] == ["HF_TOKEN=hf_[redacted]", "Loading weights: 100%|####| 2/2 [00:02<00:00]", "step=1 loss=2.0 tok/s=100"]


def test_runs_lists_every_run_worst_first_then_by_name(config):
    out = runbot("--config", str(config), "runs")
    assert out.returncode == 0
    rows = out.stdout.splitlines()
    # crashed and no log are both crit: by name; the finished run (ok) comes last, whatever the file's order
    assert [r.split()[:2] for r in rows] == [["dflash-oom", "crit"], ["eagle", "crit"], ["dflash-ok", "ok"]]
    assert "finished — last step 60" in rows[2]


def test_check_config_says_what_it_found(config):
    out = runbot("--config", str(config), "check-config")
    assert out.returncode == 0
    assert "OK — 3 runs, 0 hosts" in out.stdout
    assert "warning: " in out.stderr and "no alert channel for dflash-oom, dflash-ok, eagle" in out.stderr


def test_check_config_numbers_every_fault_with_file_and_key(tmp_path):
    bad = tmp_path / "runs.toml"
    bad.write_text('[hosts.pve1]\naddress = "10.0.0.1"\nport = 99999\n'
                   '[runs.a]\nhost = "pve1"\nlog = "rel.log"\n[runs.b]\nhost = "local"\nlog = "/b.log"\nbogus = 1\n')
    out = runbot("--config", str(bad), "check-config")
    assert out.returncode == 2
    lines = out.stderr.splitlines()
    assert lines[0] == f"runbot: {bad}: 3 faults"
    assert [line.split(": ")[1] for line in lines[1:]] == ["hosts.pve1.port", "runs.a.log", "runs.b.bogus"]
    assert all(line.startswith(f"  {n}. {bad}: ") for n, line in enumerate(lines[1:], 1))
    status = runbot("--config", str(bad), "status", "b")  # any command refuses the file the same way
    assert status.returncode == 2 and status.stderr == out.stderr


def test_check_config_warns_on_a_file_with_no_runs(tmp_path):
    empty = tmp_path / "runs.toml"
    empty.write_text("[bot]\ncheck_every = \"60s\"\n")
    out = runbot("--config", str(empty), "check-config")
    assert out.returncode == 0
    assert out.stdout.splitlines()[0] == f"{empty}: valid, but nothing to watch — 0 runs, 0 hosts"
    assert f"runbot: warning: {empty}: no runs configured" in out.stderr and "runbot init" in out.stderr


@pytest.mark.slow
def test_demo_walks_every_phase_and_exits_0():
    out = runbot("demo", "--fast")
    assert out.returncode == 0, out.stderr[-2000:]
    text = out.stdout
    for words in ("no output yet (importing?)", "no steps yet — loading weights", "tok/s", "silent",
                  "crashed — torch.OutOfMemoryError"):
        assert words in text, words


def test_save_probe_keeps_the_raw_output_for_replay(config, tmp_path):
    import json

    from bot.probe.checkup import verdict_from_output
    from bot.probe.runners import RunResult
    from config.registry import load_registry

    keep = tmp_path / "captures"
    out = runbot("--config", str(config), "--save-probe", str(keep), "status", "dflash-oom")
    assert out.returncode == 0
    probe = next(keep.glob("dflash-oom-*.probe"))
    meta = json.loads(probe.with_suffix(".json").read_text())
    run = load_registry(config).runs["dflash-oom"]
    v = verdict_from_output(run, RunResult(probe.read_bytes(), b"", meta["exit_status"]), meta["nonce"])
    assert v.headline == out.stdout.splitlines()[0]


def test_save_probe_into_a_place_it_cannot_write_exits_2(config, tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    out = runbot("--config", str(config), "--save-probe", str(blocker / "sub"), "status", "dflash-oom")
    assert out.returncode == 2 and "--save-probe" in out.stderr and "Traceback" not in out.stderr


def test_with_runbot_state_db_each_probe_adds_to_the_runs_memory(config, tmp_path):
    from bot.service.store import Store

    state = tmp_path / "memory.sqlite3"
    for args in (("status", "dflash-ok"), ("runs",)):
        out = runbot("--config", str(config), *args, env={"RUNBOT_STATE_DB": str(state)})
        assert out.returncode == 0 and out.stderr == "", out.stderr
    store = Store(state)
    try:
        ok = store.points("dflash-ok", 0)
        assert ok and ok[-1].step is not None  # its newest step, from the status and then from runs
        assert set(store.recent(0)) == {"dflash-ok", "dflash-oom", "eagle"}
        assert store.tallies()["dflash-ok"].last_step == ok[-1].step
    finally:
        store.close()
    out = runbot("--config", str(config), "status", "dflash-ok")  # no RUNBOT_STATE_DB: nothing is written
    assert out.returncode == 0 and not (tmp_path / "runbot.sqlite3").exists() and not (REPO / "runbot.sqlite3").exists()


def test_an_unusable_runbot_state_db_is_one_line_and_the_answer_still_comes(config, tmp_path):
    out = runbot("--config", str(config), "status", "dflash-oom", env={"RUNBOT_STATE_DB": str(tmp_path / "no" / "dir.db")})
    assert out.returncode == 0 and out.stdout.startswith("crashed — ")
    assert len(out.stderr.strip().splitlines()) == 1 and "answering without the runs' memory" in out.stderr, out.stderr


# -- conventions a newcomer brings from git, kubectl and docker (issue 15) ----------------------


@pytest.mark.parametrize("args", [
    ("--config", "{config}", "status", "dflash-ok"),
    ("status", "dflash-ok", "--config", "{config}"),
    ("status", "--config", "{config}", "dflash-ok"),
])
def test_global_options_go_on_either_side_of_the_command(config, args):
    out = runbot(*(a.format(config=config) for a in args))
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("finished — last step 60")


def test_save_probe_after_the_command_is_taken_too(config, tmp_path):
    out = runbot("status", "dflash-oom", "--save-probe", str(tmp_path / "keep"), "--config", str(config))
    assert out.returncode == 0, out.stderr
    assert list((tmp_path / "keep").glob("dflash-oom-*.probe"))


def test_an_option_given_on_both_sides_takes_the_one_after_the_command(config, tmp_path):
    out = runbot("--config", str(tmp_path / "nope.toml"), "status", "dflash-ok", "--config", str(config))
    assert out.returncode == 0, out.stderr


@pytest.mark.parametrize("form", [("3",), ("-n", "3"), ("-n3",), ("--lines", "3"), ("--lines=3",), ("3", "-n", "3")])
def test_tail_takes_n_as_a_word_or_as_an_option(tmp_path, form):
    log = tmp_path / "train.log"
    log.write_text("".join(f"step={i} loss=2.0 tok/s=100\n" for i in range(10)))
    path = tmp_path / "runs.toml"
    path.write_text(f'[runs.r]\nhost = "local"\nlog = "{log}"\ngpu_samples = 1\n')
    with writer_holding(log):
        out = runbot("--config", str(path), "tail", "r", *form)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines()[1:] == [f"step={i} loss=2.0 tok/s=100" for i in (7, 8, 9)]


def test_version_is_the_packages_own():
    import bot

    out = runbot("--version")
    assert out.returncode == 0
    assert out.stdout.startswith(f"runbot {bot.__version__} (Python ")
    assert 'dynamic = ["version"]' in (REPO / "pyproject.toml").read_text()  # one definition: pip reads the same


COMMANDS = ["status", "gpus", "tail", "runs", "check-config", "doctor", "init", "serve", "preview", "replay", "plot", "demo",
            "discover", "host", "history"]


@pytest.mark.parametrize("command", COMMANDS)
def test_every_command_has_real_help_with_its_arguments_and_exit_codes(command, capsys):
    from bot import cli

    assert cli.main([command, "--help"]) == 0
    help_text = capsys.readouterr().out
    description = help_text.split("\n\n")[1]
    assert len(description.split()) >= 8, help_text  # says what it does, not just a usage line
    assert "exit status:" in help_text and "\n  0  " in help_text
    assert "--config PATH" in help_text  # the global options are listed where they are accepted
    if command in ("status", "gpus", "tail", "preview", "plot", "history"):
        assert "RUN" in help_text and "unique prefix" in help_text
    if command in ("status", "gpus", "tail", "preview"):
        assert "\n  3  the run could not be reached" in help_text
    if command in ("discover", "host"):
        assert "HOST" in help_text and "host_view = true" in help_text and "\n  3  the host could not be reached" in help_text


def test_every_command_is_in_the_help_test():
    from bot import cli

    sub = next(a for a in cli._parser()._actions if isinstance(a, __import__("argparse")._SubParsersAction))
    assert sorted(sub.choices) == sorted(COMMANDS)


def test_serve_help_says_which_tokens_each_mode_needs(capsys):
    from bot import cli

    assert cli.main(["serve", "--help"]) == 0
    text = capsys.readouterr().out
    socket, http = text.split("Socket Mode", 1)[1].split("HTTP mode", 1)
    assert "SLACK_BOT_TOKEN" in socket and "SLACK_APP_TOKEN" in socket and "xapp-" in socket
    assert "SLACK_BOT_TOKEN" in http and "SLACK_SIGNING_SECRET" in http and "PORT" in http
    assert "\n  1  Slack refused a token" in text and "\n  2  a bad configuration" in text


# -- runbot init ---------------------------------------------------------------------------------


def test_init_writes_the_commented_example_where_runbot_looks(tmp_path):
    out = runbot("init", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    written = tmp_path / "config" / "runs.toml"
    assert written.read_text() == (REPO / "config" / "runs.example.toml").read_text()
    assert "`runbot check-config`" in out.stdout
    check = runbot("check-config", cwd=tmp_path)  # the default path: no --config needed
    assert check.returncode == 0, check.stderr


def test_init_path_names_the_file_and_the_hint_names_the_flag(tmp_path):
    out = runbot("init", str(tmp_path / "deep" / "mine.toml"), cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert f"runbot --config {tmp_path / 'deep' / 'mine.toml'} check-config" in out.stdout
    assert runbot("--config", str(tmp_path / "deep" / "mine.toml"), "check-config").returncode == 0
    assert runbot("init", str(tmp_path / "deep")).returncode == 0  # a folder gets a runs.toml inside
    assert (tmp_path / "deep" / "runs.toml").is_file()


def test_init_never_replaces_a_file_unless_forced(tmp_path):
    mine = tmp_path / "runs.toml"
    mine.write_text("# my own\n")
    out = runbot("init", str(mine))
    assert out.returncode == 2 and "exists" in out.stderr and "--force" in out.stderr
    assert mine.read_text() == "# my own\n"
    assert runbot("init", "--force", str(mine)).returncode == 0
    assert mine.read_text().startswith("# runbot configuration")


def test_init_follows_config_and_dash_prints(tmp_path):
    assert runbot("--config", str(tmp_path / "c.toml"), "init").returncode == 0
    assert (tmp_path / "c.toml").is_file()
    out = runbot("init", "-", cwd=tmp_path)
    assert out.returncode == 0 and out.stdout == (REPO / "config" / "runs.example.toml").read_text()


def test_the_example_init_writes_ships_with_the_package():
    from config import example

    assert example.text() == (REPO / "config" / "runs.example.toml").read_text()
    assert '"*.toml"' in (REPO / "pyproject.toml").read_text()  # package-data: pip installs it


@pytest.mark.parametrize("how", [("-v",), ("--verbose",), ()])
def test_verbose_and_runbot_log_level_say_what_runbot_does(config, how):
    env = {} if how else {"RUNBOT_LOG_LEVEL": "debug"}
    out = runbot("status", "dflash-ok", *how, "--config", str(config), env=env)
    assert out.returncode == 0, out.stderr
    assert "runbot: debug: runbot.cli: probed dflash-ok (local · " in out.stderr


def test_quiet_by_default_and_a_bad_log_level_exits_2(config):
    assert runbot("--config", str(config), "status", "dflash-ok").stderr == ""
    out = runbot("--config", str(config), "status", "dflash-ok", env={"RUNBOT_LOG_LEVEL": "loud"})
    assert out.returncode == 2 and out.stderr.startswith("runbot: environment: RUNBOT_LOG_LEVEL: ")


def test_tail_of_a_missing_log_says_it_does_not_exist(config):
    out = runbot("--config", str(config), "tail", "eagle")
    assert out.returncode == 0
    head, note = out.stdout.splitlines()
    assert head.startswith("log not found: ") and note == "  (the log does not exist)"
