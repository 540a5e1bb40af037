"""`runbot replay`: probes saved with --save-probe re-diagnosed by today's runbot, at their time or later."""

from __future__ import annotations

import json
import os
import shutil
import threading
from pathlib import Path

import pytest

from bot.core.sections import Sections, moved_on
from bot.core.verdict import Phase
from bot.probe import replay
from tests.standins import writer_holding
from tests.test_cli import runbot

JOBS = Path(__file__).parent / "fixtures" / "gpu-jobs"
HF_TRAINING = next((JOBS / "hf" / "training" / "probe-status").glob("*.probe"))
HF_FINISHED = next((JOBS / "hf" / "finished" / "probe-status").glob("*.probe"))


def test_moving_a_probe_on_moves_only_the_clock_and_the_processes_age():
    parts = {"meta": b"now=100.5\nhost=ct\nsize=10 mtime=90 inode=1\n", "window": b"step=1 now=100\n",
             "writers": b"# hidden 0\n  573 26 python3 train.py --epochs 3\n"}
    later = moved_on(Sections(parts), 900)
    assert later.parts["meta"] == b"now=1000.500000\nhost=ct\nsize=10 mtime=90 inode=1\n"
    assert later.parts["writers"] == b"# hidden 0\n  573 926 python3 train.py --epochs 3\n"
    assert later.parts["window"] == parts["window"]  # the log's own text is never touched
    assert moved_on(Sections(parts), 0) == Sections(parts)


def test_a_device_capture_replays_at_its_time_and_later(tmp_path):
    out = runbot("replay", str(HF_TRAINING), cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0] == f"# {HF_TRAINING.name}" and lines[1].startswith("step 18/120 · ")
    later = runbot("replay", "--later", "15m", str(HF_TRAINING), cwd=tmp_path)
    assert later.stdout.splitlines()[1].startswith("silent 15 min — last step 18/120; process alive")
    assert "up 15 min" in later.stdout


def test_probes_replay_in_order_each_with_the_one_before(tmp_path):
    """A folder of captures is a run's history: the second verdict knows the first (its rate change, its
    progress age), as the watchdog's sweeps do."""
    for p in (HF_FINISHED, HF_TRAINING):
        shutil.copy(p, tmp_path)
        shutil.copy(p.with_suffix(".json"), tmp_path)
    captures = [replay.load(p) for p in sorted(tmp_path.glob("*.probe"), reverse=True)]
    verdicts = replay.replay(captures, {})
    assert [c.path.name for c, _ in verdicts] == [HF_TRAINING.name, HF_FINISHED.name]  # by saved_at, not by name
    assert [v.phase for _, v in verdicts] == [Phase.TRAINING, Phase.FINISHED]


def test_a_configured_run_replays_with_its_own_policy(tmp_path):
    """The device run allowed 20 s of silence: replayed against its config, 1 minute on is already silent;
    with runbot's defaults (no config here) it is not."""
    config = tmp_path / "runs.toml"
    config.write_text('[runs.hf]\nhost = "local"\nlog = "train.log"\nsilence_after = "20s"\n')
    mine = runbot("--config", str(config), "replay", "--later", "1m", str(HF_TRAINING), cwd=tmp_path)
    theirs = runbot("replay", "--later", "1m", str(HF_TRAINING), cwd=tmp_path)
    assert mine.stdout.splitlines()[1].startswith("silent 1 min")
    assert theirs.stdout.splitlines()[1].startswith("step 18/120")


def test_a_probe_saved_by_the_cli_replays_to_the_same_answer(tmp_path):
    log = tmp_path / "train.log"
    log.write_text("".join(f"step={i} loss={3 - i / 10:.2f} tok/s=14100\n" for i in range(1, 9)))
    config = tmp_path / "runs.toml"
    config.write_text(f'[runs.r]\nhost = "local"\nlog = "{log}"\ngpu_samples = 1\n')
    with writer_holding(log):
        live = runbot("--config", str(config), "--save-probe", str(tmp_path / "saved"), "status", "r", cwd=tmp_path)
    again = runbot("--config", str(config), "replay", str(tmp_path / "saved"), cwd=tmp_path)
    assert live.returncode == again.returncode == 0, again.stderr
    assert again.stdout.splitlines()[1:] == live.stdout.splitlines()


@pytest.mark.parametrize(("args", "words"), [
    (["replay", "/etc/hostname"], "a saved probe is a .probe with its .json beside it"),
    (["replay", "--later", "15x", "x.probe"], 'bad duration "15x"'),
    (["replay", "."], "no saved probes in ."),
])
def test_what_is_not_a_capture_is_said_in_one_line(tmp_path, args, words):
    out = runbot(*args, cwd=tmp_path)
    assert out.returncode == 2 and words in out.stderr and "Traceback" not in out.stderr


def test_a_broken_metadata_file_is_said_not_raised(tmp_path):
    (tmp_path / "x.probe").write_bytes(b"")
    (tmp_path / "x.json").write_text("[1, 2]")
    with pytest.raises(replay.CaptureError, match="no run or nonce"):
        replay.load(tmp_path / "x.probe")


# -- what is not a saved probe is refused, unread, in one printable line -----------------------------

META = {"run": "hf", "nonce": "5e3c285e2aefc971", "exit_status": 0, "failure": None, "failure_kind": None,
        "elapsed_s": 0.97, "stderr": "", "saved_at": 1796119151.58}


def _load_within(path, seconds: float = 5.0):
    """replay.load(path) or the CaptureError it raised; it must not block (a FIFO waits for a writer)."""
    box: dict = {}

    def go():
        try:
            box["capture"] = replay.load(path)
        except replay.CaptureError as exc:
            box["error"] = str(exc)

    worker = threading.Thread(target=go, daemon=True)
    worker.start()
    worker.join(seconds)
    assert not worker.is_alive(), f"replay.load({path.name}) still blocked after {seconds:g} s"
    return box.get("capture"), box.get("error")


def _capture(tmp_path, meta=META, probe: bytes = b"") -> Path:
    (tmp_path / "x.json").write_text(json.dumps(meta) if not isinstance(meta, str) else meta)
    (tmp_path / "x.probe").write_bytes(probe)
    return tmp_path / "x.probe"


@pytest.mark.parametrize("which", ["x.probe", "x.json"])
@pytest.mark.parametrize("kind", ["link to /dev/zero", "fifo", "folder"])
def test_a_device_a_fifo_or_a_folder_is_refused_unread(tmp_path, which, kind):
    probe = _capture(tmp_path)
    target = tmp_path / which
    target.unlink()
    if kind == "fifo":
        os.mkfifo(target)
    elif kind == "folder":
        target.mkdir()
    else:
        target.symlink_to("/dev/zero")
    capture, error = _load_within(probe)
    assert capture is None and error is not None and "not a regular file" in error and error.isprintable()


def test_a_file_too_big_to_be_a_saved_probe_is_refused_unread(tmp_path):
    probe = _capture(tmp_path)
    with open(probe, "wb") as f:
        f.truncate(replay.MAX_PROBE_BYTES + 1)  # sparse: nothing written, nothing to read
    capture, error = _load_within(probe)
    assert capture is None and "over 32 MiB" in error
    (tmp_path / "x.json").write_text(json.dumps({**META, "stderr": "x" * replay.MAX_META_BYTES}))
    assert "over 1 MiB" in _load_within(_capture(tmp_path, meta=(tmp_path / "x.json").read_text()))[1]


@pytest.mark.parametrize(("field", "value"), [
    ("exit_status", "0"), ("exit_status", 1.5), ("exit_status", True), ("elapsed_s", "fast"), ("elapsed_s", [1]),
    ("saved_at", {"t": 1}), ("saved_at", float("inf")), ("failure", 3), ("failure", ["a"]), ("failure_kind", 1),
    ("stderr", {"x": 1}), ("run", 7), ("nonce", None),
])
def test_wrong_typed_metadata_is_said_not_raised(tmp_path, field, value):
    capture, error = _load_within(_capture(tmp_path, meta={**META, field: value}))
    assert capture is None and error is not None and error.isprintable()
    assert field in error or "no run or nonce" in error


@pytest.mark.parametrize("meta", [
    "[" * 100_000 + "]" * 100_000,
    '{"run": "hf", "nonce": "n", "failure": ' + '{"a": ' * 50_000 + "1" + "}" * 50_000 + "}",
    "\xff\xfe not utf-8", "{", "null",
], ids=["deep list", "deep field", "not utf-8", "cut short", "null"])
def test_deep_or_broken_json_is_said_not_raised(tmp_path, meta):
    path = tmp_path / "x.json"
    path.write_bytes(meta.encode("latin-1") if meta.startswith("\xff") else meta.encode())
    (tmp_path / "x.probe").write_bytes(b"")
    capture, error = _load_within(tmp_path / "x.probe")
    assert capture is None and error is not None and error.isprintable() and len(error) < 300


def test_what_a_capture_says_is_printed_printable(tmp_path):
    """A capture from elsewhere: its failure, its run's name and its file's name may hold escapes; the CLI
    prints none of them, and no traceback whatever the files hold."""
    hostile = "\x1b]0;pwned\x07\x1b[2J\x9b31m\u202eevil\u2066 DB_PASS=hunter2hunter2"
    name = tmp_path / "cap\x1b[31m.probe"
    (tmp_path / "cap\x1b[31m.json").write_text(json.dumps({**META, "run": "hf\x1b[1m", "failure": hostile,
                                                           "failure_kind": "unreachable"}))
    name.write_bytes(b"")
    out = runbot("replay", str(name), cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert all(line.isprintable() for line in out.stdout.splitlines()), out.stdout
    assert "hunter2" not in out.stdout and "evil" in out.stdout
    fifo = tmp_path / "f.probe"
    os.mkfifo(fifo)
    (tmp_path / "f.json").write_text(json.dumps(META))
    refused = runbot("replay", str(fifo), cwd=tmp_path)
    assert refused.returncode == 2 and "not a regular file" in refused.stderr and "Traceback" not in refused.stderr
