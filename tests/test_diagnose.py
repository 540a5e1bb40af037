"""The diagnosis, table-driven over plain data: (log text, age, writers, GPUs) -> phase and verdict."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bot.core.diagnose import diagnose, learned_threshold
from bot.core.facts import Crash, Kind, Step
from bot.core.stages import words
from bot.core.verdict import Concern, Level, Phase, Worry
from bot.render.facts import Row, rows as fact_rows
from tests.builders import KEY_BODY, evidence, gpu_section
from tests.standins import REAL_FIXTURES

OK_LOG = (REAL_FIXTURES / "train_ok.log").read_bytes()
OOM_LOG = (REAL_FIXTURES / "train_oom.log").read_bytes()
BAR_27 = OK_LOG[: OK_LOG.index(b"\rLoading weights:  55%")]  # caught mid-bar, as a probe would
BAR_DONE = OK_LOG[: OK_LOG.index(b"step=2 ")]
TEN_STEPS = OK_LOG[: OK_LOG.index(b"step=12 ")]
NOBODY: tuple = ()


@dataclass
class Run:
    name: str = "dflash"
    log: str = "/workspace/train.log"
    silence_after: float | None = 600.0
    loading_grace: float = 2700.0
    slow_below: float = 0.6
    slow_for: float = 600.0
    loss_spike: bool = False
    gpus: dict = field(default_factory=dict)

    @property
    def roles(self):
        return self.gpus


THREAD_DEATH = (
    "step=10 loss=2.5 tok/s=14000\n"
    "Exception in thread drafter-1:\n"
    "Traceback (most recent call last):\n"
    '  File "/usr/lib/python3.12/threading.py", line 1075, in _bootstrap_inner\n'
    "    self.run()\n"
    '  File "/workspace/train.py", line 40, in run\n'
    "    raise RuntimeError(\"drafter lost its queue\")\n"
    "RuntimeError: drafter lost its queue\n"
    "step=12 loss=2.4 tok/s=14100\n"
    "step=14 loss=2.4 tok/s=14150\n"
)
TORCHRUN = """step: 120  loss:  3.1  memory: 30.12GiB(38.02%)  tps: 14,213
[rank3]:[E ProcessGroupNCCL.cpp:632] [Rank 3] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=1234, OpType=ALLREDUCE, NumelIn=1, NumelOut=1, Timeout(ms)=600000) ran for 600030 milliseconds before timing out.
W1130 10:00:00.000000 123 torch/distributed/elastic/multiprocessing/api.py:897] Sending process 101 closing signal SIGTERM
E1130 10:00:01.000000 123 torch/distributed/elastic/multiprocessing/api.py:869] failed (exitcode: -6) local_rank: 3 (pid: 104) of binary: /usr/bin/python3
Traceback (most recent call last):
  File "/usr/local/bin/torchrun", line 8, in <module>
    sys.exit(main())
torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
============================================================
train.py FAILED
------------------------------------------------------------
Failures:
[1]:
  time      : 2026-11-30_10:00:01
  host      : gpu1
  rank      : 0 (local_rank: 0)
  exitcode  : -15 (pid: 101)
  error_file: <N/A>
  traceback : Signal 15 (SIGTERM) received by PID 101
------------------------------------------------------------
Root Cause (first observed failure):
[0]:
  time      : 2026-11-30_10:00:01
  host      : gpu1
  rank      : 3 (local_rank: 3)
  exitcode  : -6 (pid: 104)
  error_file: <N/A>
  traceback : Signal 6 (SIGABRT) received by PID 104
============================================================
"""
HF_SAVE = (
    "{'loss': 2.31, 'grad_norm': 1.2, 'learning_rate': 5e-05, 'epoch': 0.12}\n"
    "Saving model checkpoint to /workspace/out/checkpoint-1000\n"
)
EVAL_BAR = "{'loss': 2.31, 'grad_norm': 1.2, 'learning_rate': 5e-05, 'epoch': 0.12}\n***** Running Evaluation *****\n\rEvaluating:  40%|####      | 100/250 [00:10<00:15, 9.80it/s]"
MEGATRON = " iteration       10/    1000 | consumed samples: 640 | elapsed time per iteration (ms): 1234.5 | learning rate: 1.0E-04 | lm loss: 7.399415E+00 | loss scale: 1.0 |\n"
NANO = "iter 10: loss 4.2345, time 120.45ms, mfu 31.20%\n"
TITAN = "\x1b[31mstep: 10  \x1b[32mloss:  7.1234  \x1b[33mmemory: 30.12GiB(38.02%)  \x1b[34mtps: 14,213\x1b[39m\n"

BUSY2 = [[(0, 70000, 100), (1, 70000, 100)]] * 3
IDLE_DRAFTER = [[(0, 70000, 100), (1, 4, 0)], [(0, 70000, 0), (1, 4, 0)], [(0, 70000, 90), (1, 4, 0)]]
SPIN = [[(0, 70000, 100), (1, 70000, 0)]] * 4

CASES = [
    # id, log, probe kwargs, run kwargs, phase, level, headline must contain
    ("no log", None, {}, {}, Phase.NO_LOG, Level.CRIT, "log not found: /workspace/train.log"),
    ("importing", b"", {"writers": [(692, 12, "python3 train.py")]}, {}, Phase.STARTING, Level.NOTE,
     "started 12 s ago, no output yet (importing?)"),
    ("loading mid-bar", BAR_27, {}, {}, Phase.LOADING, Level.NOTE,
     "no steps yet — loading weights 27% (59/219) — Target 0 on cuda:0"),
    ("bar closed, no step yet", BAR_DONE, {}, {}, Phase.LOADING, Level.NOTE, "waiting for the first step"),
    ("training", TEN_STEPS, {"age": 1}, {}, Phase.TRAINING, Level.OK, "step 10 · 41.3K tok/s · loss 10.77 · 1 s ago"),
    ("silent training", TEN_STEPS, {"age": 720}, {}, Phase.SILENT, Level.CRIT, "silent 12 min — last step 10; process alive"),
    ("silent names idle GPUs", TEN_STEPS, {"age": 720, "gpus": gpu_section([[(0, 70000, 0), (1, 70000, 0)]] * 3)},
     {}, Phase.SILENT, Level.CRIT, "GPUs 0–1 idle"),
    ("stuck collective", TEN_STEPS, {"age": 720, "gpus": gpu_section(SPIN)}, {}, Phase.SILENT, Level.CRIT,
     "GPU 0 at 100 % with no new steps (stuck in a collective?), waiting on idle GPU 1"),
    # The loading grace is for loading that moves (issue 20, class 3): this bar ran at 587 it/s, so 20 min
    # without a frame is a hang; within silence_after it is loading.
    ("loading within silence_after", BAR_27, {"age": 300}, {}, Phase.LOADING, Level.NOTE, "loading weights 27%"),
    ("a frozen loading bar is a hang", BAR_27, {"age": 1200}, {}, Phase.SILENT, Level.CRIT,
     "silent 20 min — while no steps yet — loading weights 27% (59/219)"),
    ("loading past its grace", BAR_27, {"age": 3000}, {}, Phase.SILENT, Level.CRIT,
     "silent 50 min — while no steps yet — loading weights 27% (59/219)"),
    ("crashed OOM", OOM_LOG, {"writers": NOBODY, "age": 5}, {}, Phase.CRASHED, Level.CRIT,
     "crashed — torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 372.53 GiB. … at step 10; process gone"),
    ("traceback but still alive", OOM_LOG, {"age": 5}, {}, Phase.CRASHED, Level.CRIT, "still alive"),
    ("finished", OK_LOG, {"writers": NOBODY, "age": 60}, {}, Phase.FINISHED, Level.OK, "finished — last step 60"),
    ("stopped without a word", TEN_STEPS, {"writers": NOBODY, "age": 300}, {}, Phase.STOPPED, Level.CRIT,
     "stopped — process gone after step 10"),
    ("empty and nobody writes", b"", {"writers": NOBODY, "age": 300}, {}, Phase.STOPPED, Level.CRIT, "not running"),
    ("thread died", THREAD_DEATH, {"age": 1}, {}, Phase.THREAD_DIED, Level.WARN,
     "training, but thread drafter-1 died: RuntimeError: drafter lost its queue"),
    ("torchrun root cause", TORCHRUN, {"writers": NOBODY}, {}, Phase.CRASHED, Level.CRIT,
     "crashed — rank 3: NCCL collective timeout: ALLREDUCE"),  # the worker's own error, not the launcher's echo
    ("saving", HF_SAVE, {"age": 720}, {}, Phase.SAVING, Level.NOTE, "saving checkpoint at step 1000 — 12 min so far"),
    ("evaluating", EVAL_BAR, {"age": 30}, {}, Phase.EVALUATING, Level.NOTE, "evaluating 40% (100/250)"),
    ("megatron", MEGATRON, {}, {}, Phase.TRAINING, Level.OK, "iteration 10/1000 · loss 7.399"),  # Megatron's own word
    ("nanogpt", NANO, {}, {}, Phase.TRAINING, Level.OK, "step 10 · loss 4.234"),
    ("torchtitan", TITAN, {}, {}, Phase.TRAINING, Level.OK, "step 10 · 14.2K tok/s · loss 7.123"),
    ("hf dict", HF_SAVE.splitlines()[0], {}, {}, Phase.TRAINING, Level.OK, "loss 2.31"),
    ("idle drafter while training", TEN_STEPS, {"gpus": gpu_section(IDLE_DRAFTER)},
     {"gpus": {"target": [0], "drafter": [1]}}, Phase.TRAINING, Level.WARN, "drafter GPUs idle"),
    ("every GPU idle with a fresh log is no finding", TEN_STEPS, {"gpus": gpu_section([[(0, 70000, 0), (1, 4, 0)]] * 3)},
     {"gpus": {"target": [0], "drafter": [1]}}, Phase.TRAINING, Level.OK, "step 10"),
    ("busy roles are fine", TEN_STEPS, {"gpus": gpu_section(BUSY2)},
     {"gpus": {"target": [0], "drafter": [1]}}, Phase.TRAINING, Level.OK, "step 10"),
]


@pytest.mark.parametrize("log, probe, run, phase, level, words", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_verdicts(log, probe, run, phase, level, words):
    v = diagnose(evidence(log, **probe), Run(**run))
    assert (v.phase, v.level) == (phase, level), v.headline
    assert words in v.headline


def test_idle_gpus_while_loading_are_said_calmly():
    v = diagnose(evidence(BAR_27, gpus=gpu_section([[(0, 3000, 10), (1, 4, 0)]] * 3)), Run())
    assert any("expected while loading" in r.text for r in fact_rows(v) if r.label == "GPUs")


def test_verdict_concerns_are_machine_readable():
    assert diagnose(evidence(TEN_STEPS, age=720), Run()).concerns == (Concern(Worry.SILENT),)
    v = diagnose(evidence(THREAD_DEATH, age=1), Run())
    assert v.concerns == (Concern(Worry.THREAD_DIED, "drafter-1"),)


def test_auto_threshold_learns_from_the_step_interval():
    steps = [Step(line="", step=i, elapsed=i * 2.0) for i in range(10)]
    assert learned_threshold(steps) == 120.0  # 8 x 2 s, raised to the floor
    slow = [Step(line="", step=i, elapsed=i * 100.0) for i in range(10)]
    assert learned_threshold(slow) == 800.0
    assert learned_threshold(steps[:2]) is None
    log = "".join(f"step={i} loss=1.0 elapsed={i * 100}s\n" for i in range(10))
    assert diagnose(evidence(log, age=700), Run(silence_after=None)).phase is Phase.TRAINING
    assert diagnose(evidence(log, age=900), Run(silence_after=None)).phase is Phase.SILENT


def test_the_remote_clock_is_used_not_ours():
    # The remote clock is an hour ahead of the test machine's: age is still 2 s.
    v = diagnose(evidence(TEN_STEPS, age=2, now=2_000_000_000.0), Run())
    assert v.phase is Phase.TRAINING and "2 s ago" in v.headline


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=3000), st.floats(0, 1e6), st.booleans())
def test_diagnose_never_raises(log, age, alive):
    v = diagnose(evidence(log, age=age, writers=[(1, 5, "python3 x.py")] if alive else ()), Run())
    assert v.headline and "\n" not in v.headline


def test_a_log_truncated_between_stat_and_read_still_gives_a_verdict():
    # stat saw 10 MB, then the file was truncated: the window came back short.
    ev = evidence(TEN_STEPS)
    ev = type(ev)(**{**ev.__dict__, "log": type(ev.log)(**{**ev.log.__dict__, "size": 10_000_000})})
    v = diagnose(ev, Run())
    assert v.phase is Phase.TRAINING and v.headline.startswith("step 10 · ")


def test_the_rate_change_since_the_last_check_is_said_when_there_is_one():
    first = diagnose(evidence("step=10 loss=2.0 tok/s=10000\n"), Run())
    faster = diagnose(evidence("step=12 loss=2.0 tok/s=11000\n"), Run(), previous=first)
    same = diagnose(evidence("step=12 loss=2.0 tok/s=10010\n"), Run(), previous=first)
    assert "11K tok/s (+10 % since last check)" in faster.headline
    assert "since last check" not in same.headline


def test_a_writer_hidden_from_a_non_root_probe_is_not_called_gone():
    # The probe's user could not read 12 processes' fds: no writer seen is not "process gone".
    v = diagnose(evidence(TEN_STEPS, age=120, writers=NOBODY, hidden=12), Run())
    assert v.phase is Phase.TRAINING, v.headline
    assert Row("writer", "not visible: 12 processes hidden from the probe's user (probe as root to see them)") in fact_rows(v)
    v = diagnose(evidence(TEN_STEPS, age=720, writers=NOBODY, hidden=12), Run())
    assert v.phase is Phase.SILENT and "writer not visible to the probe" in v.headline
    # With every process visible, the same log is a stopped run.
    assert diagnose(evidence(TEN_STEPS, age=120, writers=NOBODY), Run()).phase is Phase.STOPPED


def test_done_but_never_exiting_is_a_hang_on_exit():
    v = diagnose(evidence(OK_LOG, age=5), Run())
    assert (v.phase, v.level) == (Phase.FINISHED, Level.OK) and v.headline == "finished — last step 60 · loss 10.79; process exiting"
    v = diagnose(evidence(OK_LOG, age=900), Run())
    assert (v.phase, v.level) == (Phase.FINISHED, Level.WARN)
    assert v.headline == "finished — last step 60 · loss 10.79, but process 692 still alive 15 min later (hung on exit?)"
    assert Concern(Worry.HUNG_ON_EXIT) in v.concerns


def test_an_unreadable_log_is_said():
    v = diagnose(evidence(TEN_STEPS, readable=False), Run())
    assert v.phase is Phase.NO_LOG and v.level is Level.CRIT
    assert "cannot read the log" in v.headline and "permission denied" in v.headline


def test_no_log_names_the_likeliest_process():
    procs = [(10, 900_000, "/usr/bin/python3 /usr/bin/unattended-upgrade"),
             (20, 40, "python3 /home/ana/eval.py"),
             (30, 300, "torchrun --nproc-per-node 8 /workspace/train.py")]
    v = diagnose(evidence(None, processes=procs), Run())
    assert "torchrun --nproc-per-node 8 /workspace/train.py running for 5 min" in v.headline
    v = diagnose(evidence(None, processes=procs[:2]), Run(log="/data/x.log"))
    assert "python3 /home/ana/eval.py running for 40 s" in v.headline  # the newest, not the daemon


@pytest.mark.parametrize("writers", [((692, 40, "python3 train.py"),), NOBODY])
def test_a_headline_that_quotes_the_last_line_never_quotes_a_key(writers):
    """A log that ends inside a private key: the last line is base64 that only its BEGIN line,
    lines above, marks as secret. The headline quotes it redacted with those lines."""
    log = "\n".join(["loading creds", "-----BEGIN RSA PRIVATE KEY-----", *KEY_BODY]) + "\n"
    for age in (2.0, 3000.0):
        v = diagnose(evidence(log, writers=writers, age=age), Run())
        assert "last line: -----BEGIN RSA PRIVATE KEY-----[redacted]" in v.headline, v.headline
        assert not any(line[:8] in v.headline or line[-8:] in v.headline for line in KEY_BODY)


def test_a_loop_that_opens_its_log_per_write_is_alive_while_its_process_works_there():
    near = ((4242, 3600, "python train.py --out runs/exp1"),)
    v = diagnose(evidence(TEN_STEPS, age=30, writers=NOBODY, near=near), Run())
    assert v.phase is Phase.TRAINING and v.writer is not None and v.writer.pid == 4242, v.headline
    v = diagnose(evidence(TEN_STEPS, age=720, writers=NOBODY, near=near), Run())
    assert v.phase is Phase.SILENT and "process alive" in v.headline
    # A shell or an editor in the folder is not a training loop.
    v = diagnose(evidence(TEN_STEPS, age=30, writers=NOBODY, near=((77, 9, "vim notes.txt"),)), Run())
    assert v.phase is Phase.STOPPED


def test_a_bar_that_never_ends_its_line_is_read_from_the_end():
    """50 MB of `\\r`-frames and no newline: the window starts inside the one line; its frames are whole."""
    frames = "".join(f"\r{n * 100 // 900000:3d}%|#         | {n}/900000 [1:02:03<9:00:00,  2.99it/s, loss=2.{n % 97:02d}]"
                     for n in range(1, 60001))
    v = diagnose(evidence("Loading checkpoint shards: 100%|##| 4/4 [00:03<00:00,  1.10it/s]\n" + frames), Run())
    assert v.phase is Phase.TRAINING and v.step is not None and v.step.step == 60000, v.headline
    assert v.headline.startswith("step 60000/900000 · 2.99 it/s · loss 2."), v.headline


@pytest.mark.parametrize("kind", list(Kind))
def test_no_internal_word_reaches_the_headline(kind):
    """A crash with no exception and no message of its own is said in words, never as `nccl_timeout`."""
    text = words.crash(Crash(kind, None, ""))
    assert "_" not in text and text != kind.value or kind.value in ("killed", "cancelled", "interrupted"), text


def test_a_launchers_exit_code_names_the_launchers_words():
    text = words.crash(Crash(Kind.CHILD_FAILED, "launcher", "", rank=2, exit_code=-9))
    assert text == "rank 2 exited with return code -9 (SIGKILL)"
