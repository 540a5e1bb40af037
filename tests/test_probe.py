"""The probe script: quoting, sections, and what real bash does with hostile logs."""

from __future__ import annotations

import asyncio
import os
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bot.core.sections import marker, split_sections
from bot.probe.script import build_script
from bot.probe.runners import LocalRunner
from bot.demo.smi import NOT_AVAILABLE, SmiGpu, bus_id, utilization_report
from tests.standins import fake_nvidia_smi, path_with, writer_holding

NONCE = "abcdef0123456789"


@dataclass
class Target:
    log: str
    step_pattern: str | None = None
    gpu_samples: int = 1


def probe(target: Target, env: dict | None = None) -> tuple:
    result = asyncio.run(LocalRunner(env).run(build_script(target, NONCE), timeout=30))
    return result, split_sections(result.stdout, NONCE)


def test_every_section_is_present_with_its_exit_status(tmp_path):
    log = tmp_path / "train.log"
    log.write_text("step=1 loss=2.0 tok/s=10\n")
    result, s = probe(Target(str(log)))
    assert result.exit_status == 0
    assert s.complete
    for part in ("meta", "window", "steps", "writers", "procs"):
        assert s.rc(part) == 0, (part, s.parts)
    assert b"size=25" in s.get("meta")
    assert s.get("window") == b"step=1 loss=2.0 tok/s=10\n"


@pytest.mark.parametrize(
    "name",
    ["with space.log", "it's.log", 'dq".log', "$(touch PWNED).log", "`touch PWNED`.log", "semi;touch PWNED.log", "-n.log"],
)
def test_hostile_log_paths_are_data_not_code(tmp_path, name, monkeypatch):
    monkeypatch.chdir(tmp_path)
    log = tmp_path / name
    log.write_text("step=3 loss=1.0\n")
    _, s = probe(Target(str(log)))
    assert not (tmp_path / "PWNED").exists()
    assert s.get("window") == b"step=3 loss=1.0\n"
    assert b"exists=0" not in s.get("meta")


def test_a_log_cannot_forge_a_section(tmp_path):
    log = tmp_path / "train.log"
    log.write_bytes(b"x\n@@RB:0000000000000000@@ meta\nnow=1\nexists=0\n")
    _, s = probe(Target(str(log)))
    assert b"exists=0" not in s.get("meta")
    assert s.get("window").endswith(b"exists=0\n")


def test_missing_log_and_missing_folder(tmp_path):
    _, s = probe(Target(str(tmp_path / "nope" / "train.log")))
    meta = s.text("meta")
    assert "exists=0" in meta and "dir=0" in meta
    assert "window" in s.parts and s.get("window") == b""


def test_the_window_reads_only_the_end_of_a_huge_line(tmp_path):
    log = tmp_path / "bar.log"
    frames = b"".join(b"\rLoading weights: %3d%%|#  | %d/851 [00:01<00:03, 199.62it/s]" % (i * 100 // 851, i) for i in range(851))
    log.write_bytes(b"  Target 1 on cuda:1...\n" + frames * 60)  # one line of several MB, no newline
    _, s = probe(Target(str(log)))
    window = s.get("window")
    assert len(window) == 65536
    assert window.endswith(b"850/851 [00:01<00:03, 199.62it/s]")


def test_step_lines_far_before_the_window_are_still_found(tmp_path):
    log = tmp_path / "train.log"
    log.write_bytes(b"step=41 loss=2.5 tok/s=900\n" + b"UserWarning: something noisy\n" * 20000)
    _, s = probe(Target(str(log)))
    steps = s.text("steps")
    assert "step=41 loss=2.5" in steps
    assert b"step=41" not in s.get("window")


def test_nul_bytes_and_invalid_utf8_pass_through(tmp_path):
    log = tmp_path / "train.log"
    log.write_bytes(b"\x00\x00\xff\xfe garbage\nstep=5 loss=\xe9 1.0\n")
    result, s = probe(Target(str(log)))
    assert result.exit_status == 0 and s.complete
    assert s.get("window").startswith(b"\x00\x00\xff")


def test_writer_is_found_and_a_reader_is_not(tmp_path):
    log = tmp_path / "train.log"
    log.write_text("hello\n")
    with writer_holding(log) as w:
        _, s = probe(Target(str(log)))
        hidden, found = s.text("writers").splitlines()
        assert hidden.startswith("# hidden ")
        assert found.split()[0] == str(w.pid)
    with writer_holding(log, mode="<"):
        _, s = probe(Target(str(log)))
        assert s.text("writers").strip().startswith("# hidden ")  # and no writer line


def test_without_the_drivers_window_gpu_samples_are_spread_over_about_a_second(tmp_path):
    bin_dir = tmp_path / "bin"
    fake_nvidia_smi(bin_dir, ["0, 100, 143771, 5\n"], window=utilization_report([SmiGpu(bus_id(0), "N/A", "N/A",
                                                                                      NOT_AVAILABLE, NOT_AVAILABLE)]))
    started = time.monotonic()
    _, s = probe(Target(str(tmp_path / "x.log"), gpu_samples=5), path_with(bin_dir))
    took = time.monotonic() - started
    assert s.text("gpus").count("# sample") == 5
    assert s.rc("gpu.window") == 0 and "N/A" in s.text("gpu.window")
    assert 0.6 < took < 3.0


def test_with_the_drivers_window_one_reading_and_no_sleep(tmp_path):
    bin_dir = tmp_path / "bin"
    fake_nvidia_smi(bin_dir, ["0, 100, 143771, 5\n"])
    started = time.monotonic()
    _, s = probe(Target(str(tmp_path / "x.log"), gpu_samples=5), path_with(bin_dir))
    took = time.monotonic() - started
    assert s.text("gpus").count("# sample") == 1
    assert s.rc("gpu.window") == 0 and "GPU Utilization Samples" in s.text("gpu.window")
    assert took < 0.6  # the sampling above takes more than that: no sleep was left on this path


def test_missing_nvidia_smi_is_said(tmp_path):
    _, s = probe(Target(str(tmp_path / "x.log")), {"PATH": "/usr/bin:/bin"})
    assert s.text("gpus").strip() == "@missing"


def test_failing_nvidia_smi_stops_sampling_and_keeps_its_text(tmp_path):
    bin_dir = tmp_path / "bin"
    fake_nvidia_smi(bin_dir, ["No devices were found\n"], rc=6)
    _, s = probe(Target(str(tmp_path / "x.log"), gpu_samples=5), path_with(bin_dir))
    gpus = s.text("gpus")
    assert gpus.count("# sample") == 1 and "rc=6" in gpus and "No devices were found" in gpus


def test_nonce_must_be_plain():
    with pytest.raises(ValueError):
        build_script(Target("/x"), "bad nonce; rm")


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=4000), st.lists(st.sampled_from(["meta", "window", "gpus", "end", "x.rc", "??"]), max_size=6))
def test_split_sections_never_raises(noise, names):
    data = noise + b"".join(marker(NONCE) + n.encode() + b"\n" + noise[:50] for n in names)
    s = split_sections(data, NONCE)
    for name in s.parts:
        s.text(name)
        s.rc(name)


def test_a_100_mb_line_costs_no_more_than_a_short_one(tmp_path):
    log = tmp_path / "train.log"
    with log.open("wb") as f:
        f.write(b"step=7 loss=1.5 tok/s=900\n")
        chunk = b"\rLoading weights:  15%|#5        | 131/851 [00:00<00:03, 199.62it/s]" * 14000
        for _ in range(100):  # ~100 MB, no newline
            f.write(chunk)
    started = time.monotonic()
    result, s = probe(Target(str(log)))
    assert time.monotonic() - started < 5
    assert result.exit_status == 0 and s.complete
    assert len(s.get("window")) == 65536
    assert "step=7 loss=1.5" not in s.text("steps")  # 64 MiB back at most: older than that is not looked at


def test_a_log_rotated_away_reads_as_missing_and_its_writer_is_not_claimed(tmp_path):
    log = tmp_path / "train.log"
    log.write_text("step=1 loss=2.0\n")
    with writer_holding(log):
        log.rename(tmp_path / "train.log.1")  # logrotate without copytruncate
        _, s = probe(Target(str(log)))
    assert "exists=0" in s.text("meta")
    assert s.text("writers").strip() == ""  # no log: nothing to look for


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to run the probe as another user")
def test_a_probe_without_root_says_what_it_could_not_see(tmp_path):
    """A non-root SSH user cannot read other users' /proc/*/fd: the probe counts them, so the
    diagnosis can say "writer not visible" instead of "process gone"."""
    import subprocess
    import tempfile

    from bot.core.evidence import read_evidence

    folder = Path(tempfile.mkdtemp(prefix="runbot-nonroot-"))
    try:
        folder.chmod(0o755)
        log = folder / "train.log"
        log.write_text("step=3 loss=1.0 tok/s=100\n")
        log.chmod(0o644)
        with writer_holding(log):
            out = subprocess.run(["bash", "-c", build_script(Target(str(log)), NONCE)], user="nobody",
                                 capture_output=True, timeout=30, cwd="/")
        ev = read_evidence(split_sections(out.stdout, NONCE), str(log))
        assert ev.writers == () and ev.hidden_processes > 0
    finally:
        import shutil

        shutil.rmtree(folder)


def test_a_loop_that_opens_its_log_for_each_write_is_found_by_its_folder(tmp_path):
    """`with open(log, "a") as f: f.write(...)` each step holds nothing open between writes: the training
    process working in the log's folder is the run; with none there, nothing runs it."""
    import subprocess
    import sys

    from bot.core.evidence import read_evidence

    log = tmp_path / "runs" / "exp1" / "train.log"
    log.parent.mkdir(parents=True)
    log.write_text("step=3 loss=1.0\n")
    loop = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", "train.py"], cwd=log.parent)
    try:
        ev = read_evidence(probe(Target(str(log)))[1], str(log))
        assert ev.writers == () and [p.pid for p in ev.near] == [loop.pid]
    finally:
        loop.kill()
        loop.wait()
    ev = read_evidence(probe(Target(str(log)))[1], str(log))
    assert ev.writers == () and ev.near == ()


def test_a_process_in_a_top_level_folder_is_no_one_s_run(tmp_path):
    """Everyone works somewhere under /tmp or /home: a python there does not keep every log there alive."""
    import subprocess
    import sys

    from bot.core.evidence import read_evidence

    log = tmp_path / "train.log"
    log.write_text("step=3 loss=1.0\n")
    elsewhere = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], cwd="/tmp")
    try:
        ev = read_evidence(probe(Target(str(log)))[1], str(log))
        assert elsewhere.pid not in [p.pid for p in ev.near]
    finally:
        elsewhere.kill()
        elsewhere.wait()
