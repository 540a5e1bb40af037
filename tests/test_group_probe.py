"""One probe for the runs of one container: real bash reads each run's log after one /proc pass and one set of
GPU readings; each run's verdict stays its own, and old single-run captures still read."""

from __future__ import annotations

import asyncio
from pathlib import Path

from bot.core.sections import split_runs, split_sections
from bot.core.verdict import Phase
from bot.probe.checkup import verdicts_from_output
from bot.probe.replay import DefaultRun
from bot.probe.runners import LocalRunner, RunResult
from bot.probe.script import build_group_script, build_script
from tests.standins import fake_nvidia_smi, path_with, writer_holding

NONCE = "abcdef0123456789"
GPU = "0, 70000, 143771, 99\n"


def runs(tmp_path: Path) -> list[DefaultRun]:
    return [DefaultRun("training", log=str(tmp_path / "a" / "train.log")),
            DefaultRun("missing", log=str(tmp_path / "b" / "nope.log")),
            DefaultRun("hostile", log=str(tmp_path / "c" / "$(touch PWNED) it's [1]*?.log"), step_pattern=r"iter (\d+)")]


def probe(tmp_path: Path, group: list[DefaultRun]) -> RunResult:
    bin_dir = tmp_path / "bin"
    fake_nvidia_smi(bin_dir, [GPU])
    return asyncio.run(LocalRunner(path_with(bin_dir)).run(build_group_script(group, NONCE), timeout=30))


def test_each_run_gets_its_own_sections_and_the_shared_ones(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    group = runs(tmp_path)
    for d in "abc":
        (tmp_path / d).mkdir()
    Path(group[0].log).write_text("step=41 loss=2.0 tok/s=14200\nstep=42 loss=1.9 tok/s=14100\n")
    Path(group[2].log).write_text("iter 7 done\n")
    # A decoy whose name the hostile one's glob characters would match: the writer scan takes paths literally.
    decoy = tmp_path / "c" / "$(touch PWNED) it's 1xy.log"
    decoy.write_text("")
    with writer_holding(Path(group[0].log)) as writer, writer_holding(Path(group[2].log)) as other, \
            writer_holding(decoy) as wrong:
        result = probe(tmp_path, group)
        training, missing, hostile = split_runs(result.stdout, NONCE, 3)
    assert result.exit_status == 0 and not (tmp_path / "PWNED").exists()
    assert training.get("window").endswith(b"step=42 loss=1.9 tok/s=14100\n")
    assert f"{writer.pid} ".encode() in training.get("writers")
    assert b"exists=0" in missing.get("meta") and missing.get("window") == b""
    assert b"iter 7" in hostile.get("steps") and hostile.get("writers").startswith(b"# hidden")
    assert f"{other.pid} ".encode() in hostile.get("writers") and f"{wrong.pid} ".encode() not in hostile.get("writers")
    assert f"{other.pid} ".encode() not in training.get("writers")
    # The GPUs were read once, for all three, and every run sees that reading.
    assert (tmp_path / "bin" / "smi-rounds" / "counter").read_text().strip() == "1"
    assert all(s.get("gpus") == training.get("gpus") and s.complete for s in (training, missing, hostile))
    assert all(s.get(p) == training.get(p) is not None for s in (missing, hostile) for p in ("gpu.window", "gpu.window.rc"))


def test_one_runs_trouble_is_its_own_verdict(tmp_path):
    group = runs(tmp_path)
    for d in "ac":
        (tmp_path / d).mkdir()
    Path(group[0].log).write_text("step=1 loss=2.0\n" + "Traceback (most recent call last):\n"
                                  "torch.OutOfMemoryError: CUDA out of memory.\n")
    Path(group[2].log).write_text("iter 7 done\n")
    with writer_holding(Path(group[2].log)):
        result = probe(tmp_path, group)
        crashed, missing, fine = verdicts_from_output(group, result, NONCE)
    assert crashed.phase is Phase.CRASHED and "OutOfMemoryError" in crashed.headline
    assert missing.headline.startswith("log not found")
    assert fine.phase is not Phase.CRASHED and fine.step is not None and fine.step.step == 7


def test_a_probe_cut_off_after_the_first_run_fails_only_the_others(tmp_path):
    group = runs(tmp_path)[:2]
    (tmp_path / "a").mkdir()
    Path(group[0].log).write_text("step=1 loss=2.0\n")
    full = probe(tmp_path, group).stdout
    cut = full[:full.index(f"\n@@RB:{NONCE}@@ run 1".encode())]  # the connection dropped mid-way
    first, second = verdicts_from_output(group, RunResult(stdout=cut, exit_status=255), NONCE)
    assert first.phase is not Phase.UNREACHABLE and first.step is not None
    assert second.phase is Phase.UNREACHABLE and second.headline.startswith("the probe did not run")


def test_a_failed_round_trip_fails_every_run_of_it_alike(tmp_path):
    group = runs(tmp_path)
    verdicts = verdicts_from_output(group, RunResult(failure="cannot reach pve1: connection refused",
                                                     failure_kind="unreachable"), NONCE)
    assert [v.headline for v in verdicts] == ["cannot reach pve1: connection refused"] * 3


def test_a_single_run_probe_is_a_group_of_one_and_old_captures_still_read(tmp_path):
    run = runs(tmp_path)[0]
    assert build_script(run, NONCE) == build_group_script([run], NONCE)
    # A probe saved before groups existed has no `run 0` marker: it is that one run's.
    old = (f"\n@@RB:{NONCE}@@ meta\nnow=1\nsize=3 mtime=1 inode=1\n@@RB:{NONCE}@@ window\nx\n"
           f"@@RB:{NONCE}@@ gpus\n@missing\n@@RB:{NONCE}@@ end\n").encode()
    [sections] = split_runs(old, NONCE, 1)
    assert sections.parts == split_sections(old, NONCE).parts
    # Run markers beyond those asked about are set aside, never mixed into run 0.
    extra = (f"@@RB:{NONCE}@@ run 0\n@@RB:{NONCE}@@ meta\nmine\n@@RB:{NONCE}@@ run 1\n"
             f"@@RB:{NONCE}@@ meta\ntheirs\n@@RB:{NONCE}@@ end\n").encode()
    [only] = split_runs(extra, NONCE, 1)
    assert only.get("meta") == b"mine" and only.complete


def test_without_find_every_fd_is_compared_and_the_writers_are_the_same(tmp_path):
    group = runs(tmp_path)[:1]
    (tmp_path / "a").mkdir()
    Path(group[0].log).write_text("step=1 loss=2.0\n")
    bare = tmp_path / "no-find"
    bare.mkdir()
    for folder in ("/usr/bin", "/bin"):
        for tool in Path(folder).iterdir():
            if tool.name != "find" and not (bare / tool.name).exists():
                (bare / tool.name).symlink_to(tool)
    with writer_holding(Path(group[0].log)) as writer:
        listed = asyncio.run(LocalRunner().run(build_group_script(group, NONCE), timeout=30))
        each = asyncio.run(LocalRunner({"PATH": str(bare)}).run(build_group_script(group, NONCE), timeout=30))
    [a], [b] = split_runs(listed.stdout, NONCE, 1), split_runs(each.stdout, NONCE, 1)
    assert f"{writer.pid} ".encode() in a.get("writers") and a.get("writers") == b.get("writers")


def test_run_from_the_logs_folder_the_probe_never_names_itself_the_writer(tmp_path, monkeypatch):
    # Found by running `runbot status` in the log's folder: the probe's own subshells work there, and the
    # folder scan (a trainer that opens its log per write) took them for the run: a dead run read as alive.
    log = tmp_path / "runs" / "exp1" / "train.log"
    log.parent.mkdir(parents=True)
    log.write_text("step=1 loss=2.0 tok/s=10\n")
    monkeypatch.chdir(log.parent)
    run = DefaultRun("dead", log=str(log))
    result = asyncio.run(LocalRunner().run(build_group_script([run], NONCE), timeout=30))
    [sections] = split_runs(result.stdout, NONCE, 1)
    assert NONCE.encode() not in sections.get("writers"), sections.get("writers")
    [verdict] = verdicts_from_output([run], result, NONCE)
    assert verdict.phase is Phase.STOPPED
