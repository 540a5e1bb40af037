"""Incremental looks with the real bash probe: an unchanged log costs a stat (no read, no step search), a grown one
sends its new bytes, a log rewritten in place is read again in full, and saved probes stay whole."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest

from bot.core.formats import step_grep_ere
from bot.core.sections import split_runs
from bot.core.window_cache import OVERLAP_BYTES, SINCE, UNCHANGED, Seen, Stat, remember
from bot.probe.checkup import check
from bot.probe.looks import Look, Looks
from bot.probe.replay import DefaultRun, load, replay
from bot.probe.runners import LocalRunner
from bot.probe.script import build_script

NONCE = "abcdef0123456789"


def step_lines(start: int, n: int) -> bytes:
    return b"".join(b"step=%d loss=%.4f tok/s=14200\n" % (i, 2 / (i + 1)) for i in range(start, start + n))


def logging_tools(bin_dir: Path, log_file: Path) -> dict[str, str]:
    """A PATH whose dd, tail, tr, grep and stat write their arguments to `log_file`, then run the real tool."""
    bin_dir.mkdir()
    for tool in ("dd", "tail", "tr", "grep", "stat"):
        real = next(p for d in os.environ["PATH"].split(os.pathsep) if os.access(p := os.path.join(d, tool), os.X_OK))
        (bin_dir / tool).write_text(f'#!/bin/bash\nprintf "%s\\n" "{tool} $*" >> {log_file}\nexec {real} "$@"\n')
        (bin_dir / tool).chmod(0o755)
    return {"PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"}


def probe(run: DefaultRun, env: dict[str, str] | None = None, seen: Seen | None = None):
    result = asyncio.run(LocalRunner(env).run(build_script(run, NONCE, seen=seen), timeout=30))
    [sections] = split_runs(result.stdout, NONCE, 1)
    return sections


def test_an_unchanged_log_costs_a_stat_and_a_grown_one_its_new_bytes(tmp_path):
    log = tmp_path / "train.log"
    log.write_bytes(step_lines(0, 5000))
    calls = tmp_path / "calls"
    env, run = logging_tools(tmp_path / "bin", calls), DefaultRun("r", str(log))
    seen = remember(probe(run, env))
    assert seen is not None and seen.stat.size == log.stat().st_size

    calls.write_text("")
    quiet = probe(run, env, seen)
    used = calls.read_text().splitlines()
    assert UNCHANGED in quiet.parts and "window" not in quiet.parts and "steps" not in quiet.parts
    reads = [c for c in used if c.startswith(("dd ", "tail ", "tr \r")) or step_grep_ere(None) in c]
    assert reads == []  # the log was neither read nor searched
    assert [c for c in used if c.startswith("stat ") and str(log) in c] == [f"stat -L -c size=%s mtime=%Y inode=%i -- {log}"]

    with log.open("ab") as f:
        f.write(step_lines(5000, 3))
    grown = probe(run, env, seen)
    assert int(grown.get(SINCE)) == seen.stat.size - OVERLAP_BYTES
    assert grown.get("window") == log.read_bytes()[seen.stat.size - OVERLAP_BYTES:]
    assert b"step=5002" in grown.get("steps")  # the step search still runs over the file


@pytest.mark.parametrize("field, value", [("inode", "1; touch PWNED"), ("size", -1), ("mtime", 1.5), ("size", True)])
def test_seen_numbers_are_whole_numbers_or_no_script(tmp_path, field, value):
    stat = {"inode": 1, "size": 10, "mtime": 10, field: value}
    with pytest.raises(ValueError):
        build_script(DefaultRun("r", str(tmp_path / "x.log")), NONCE, seen=Seen(Stat(**stat), b"", b""))


class Counting(LocalRunner):
    def __init__(self) -> None:
        super().__init__()
        self.scripts: list[str] = []

    async def run(self, script, *, timeout, limit=None):
        self.scripts.append(script)
        return await super().run(script, timeout=timeout, limit=limit)


def test_a_log_rewritten_in_place_is_probed_again_in_full(tmp_path):
    log = tmp_path / "train.log"
    log.write_bytes(step_lines(0, 4000))
    run, look, runner = DefaultRun("r", str(log)), Look(), Counting()
    asyncio.run(check(run, runner, look=look))
    with log.open("r+b") as f:  # same inode, rewritten from the start, then longer: the seen bytes are gone
        f.write(step_lines(100000, 4000) + b"step=7 loss=0.1 tok/s=1\n")
    again = asyncio.run(check(run, runner, look=look))
    assert len(runner.scripts) == 3  # the first look, the incremental one, and its full look again
    assert again.headline == asyncio.run(check(run, LocalRunner())).headline
    assert look.seen is not None and look.seen.window == log.read_bytes()[-len(look.seen.window):]


def test_an_unchanged_logs_parse_is_kept(tmp_path, monkeypatch):
    log = tmp_path / "train.log"
    log.write_bytes(step_lines(0, 300))
    run, look = DefaultRun("r", str(log)), Look()
    parses = []
    import bot.probe.looks as looks_module
    real = looks_module.read_log_text
    monkeypatch.setattr(looks_module, "read_log_text", lambda *a: parses.append(1) or real(*a))
    first = asyncio.run(check(run, LocalRunner(), look=look))
    second = asyncio.run(check(run, LocalRunner(), look=look, learned=first.learned))
    third = asyncio.run(check(run, LocalRunner(), look=look, learned=second.learned))
    assert len(parses) == 2  # the third look was told what the second was: its parse was kept
    assert third.headline == second.headline and third.learned.counter == second.learned.counter


def test_a_saved_probe_is_always_whole_and_replays(tmp_path):
    log = tmp_path / "train.log"
    log.write_bytes(step_lines(0, 300))
    run, look = DefaultRun("r", str(log)), Look()
    asyncio.run(check(run, LocalRunner(), look=look))
    saved = tmp_path / "saved"
    verdict = asyncio.run(check(run, LocalRunner(), look=look, save_probe=saved))
    [probe_file] = saved.glob("*.probe")
    assert UNCHANGED.encode() not in probe_file.read_bytes()
    [(_, replayed)] = replay([load(probe_file)], {"r": run})
    assert replayed.headline == verdict.headline


def test_a_runs_look_is_dropped_when_its_log_or_step_pattern_changes():
    looks = Looks(most=2)
    a = looks.of(DefaultRun("a", "/x.log"))
    assert looks.of(DefaultRun("a", "/x.log")) is a
    assert looks.of(DefaultRun("a", "/y.log")) is not a
    b = looks.of(DefaultRun("a", "/y.log", step_pattern=r"it (\d+)"))
    looks.of(DefaultRun("b", "/x.log")), looks.of(DefaultRun("c", "/x.log"))
    assert len(looks) == 2 and looks.of(DefaultRun("a", "/y.log", step_pattern=r"it (\d+)")) is not b


async def test_questions_and_sweeps_share_one_memory_of_each_runs_log(tmp_path):
    """A question, then a sweep's group look, then a question: each probe after the first is told what the last
    look (whoever made it) saw."""
    from tests.test_one_pass_per_box import CountingTargets, place
    from bot.probe.scheduler import Priority, Scheduler

    registry, logs = place(tmp_path, 2)
    targets = CountingTargets(registry, None)
    scheduler = Scheduler(registry, targets)
    a, b = registry.runs.values()
    await scheduler.check(a)
    await scheduler.check_group([a, b], {}, priority=Priority.SWEEP)
    scheduler.answers.forget()
    await scheduler.check(a)
    await targets.close()
    told = [line for script in targets.scripts for line in script.splitlines() if line.startswith("SEEN_SIZES=")]
    size_a, size_b = (str(p.stat().st_size) for p in logs)
    assert told == ["SEEN_SIZES=('')", f"SEEN_SIZES=({size_a} '')", f"SEEN_SIZES=({size_a})"]
    assert scheduler.looks.of(a).seen is not None and scheduler.looks.of(b).seen is not None


def test_a_dd_without_byte_offsets_reads_the_same_bytes(tmp_path):
    log = tmp_path / "train.log"
    log.write_bytes(step_lines(0, 5000))
    old_dd = tmp_path / "bin"
    old_dd.mkdir()
    (old_dd / "dd").write_text("#!/bin/sh\necho 'dd: invalid input flag' >&2\nexit 1\n")
    (old_dd / "dd").chmod(0o755)
    run = DefaultRun("r", str(log))
    with_dd, without = probe(run), probe(run, {"PATH": f"{old_dd}{os.pathsep}{os.environ['PATH']}"})
    assert without.get("window") == with_dd.get("window") == log.read_bytes()[-65536:]
    assert remember(without) == remember(with_dd) is not None
