"""Round 3's crashes in unusual framing, over the real lines of tests/fixtures/round3 (each case names its source)."""

from __future__ import annotations

import pytest

from bot.core.crashes import find_crashes
from bot.core.diagnose import diagnose
from bot.core.facts import Kind
from bot.core.grammar import strip_stamp
from bot.core.progress import fold_tables, read_progress
from bot.core.verdict import Level, Phase
from tests.builders import evidence
from tests.test_diagnose import Run

BAR = " 10%|▉         | 51/525 [2:12:20<20:11:06, 153.30s/it]"

CASES = [
    # misc-tsai-fastai-nan-then-keyboardinterrupt: IPython names the exception on its header, the log ends in frames.
    ("ipython-header", [
        "---------------------------------------------------------------------------",
        "KeyboardInterrupt                         Traceback (most recent call last)",
        r"~\AppData\Local\Temp\ipykernel_13020\4198329076.py in <module>",
        "----> 1 learn.fit_one_cycle(25, lr_max=1e-3)",
        "      2 learn.save('stage1')",
        "",
        r"c:\Users\qixin\anaconda3\lib\site-packages\fastai\callback\schedule.py in fit_one_cycle(self, n_epoch)",
    ], Kind.INTERRUPTED, "KeyboardInterrupt", ""),
    # misc-detectron2-oom-after-22-iterations: the exception line bolded in a markdown paste.
    ("markdown-bold", [
        "Traceback (most recent call last):",
        '  File "/home/lab/site-packages/torch/autograd/__init__.py", line 99, in backward',
        "    allow_unreachable=True)  # allow_unreachable flag",
        "**RuntimeError: CUDA out of memory.** Tried to allocate 1.71 GiB (GPU 0; 31.72 GiB total capacity)",
    ], Kind.OOM, "RuntimeError", "CUDA out of memory. Tried to allocate 1.71 GiB"),
    # hf-deepspeed-fused-adam-build-failed: ninja's failure under cpp_extension's announcement, on another stream.
    ("build-failed", [
        "Building extension module fused_adam...",
        "Allowing ninja to set a default number of workers... (overridable by setting the environment variable MAX_JOBS=N)",
        "[rank1]: Traceback (most recent call last):",
        '[rank1]:   File "[..]/torch/utils/cpp_extension.py", line 2105, in _run_ninja_build',
        "[rank1]:     subprocess.run(",
        "[rank1]: subprocess.CalledProcessError: Command '['ninja', '-v']' returned non-zero exit status 1.",
    ], Kind.TRACEBACK, None, "building fused_adam failed (ninja exit status 1)"),
    # hf-axolotl-death-signal-sighup-step51: torchrun's agent raising on the signal it received.
    ("signal-exception", [
        "Traceback (most recent call last):",
        '  File "/usr/bin/torchrun", line 8, in <module>',
        "torch.distributed.elastic.multiprocessing.api.SignalException: Process 46660 got signal: 1",
    ], Kind.SIGNAL, None, "the launcher received SIGHUP"),
]


@pytest.mark.parametrize("name, lines, kind, exc_type, message", CASES, ids=[c[0] for c in CASES])
def test_unusual_framing(name, lines, kind, exc_type, message):
    crash = find_crashes(lines)[-1]
    assert (crash.kind, crash.exc_type) == (kind, exc_type)
    assert crash.message.startswith(message)


def test_a_header_glued_onto_the_open_bar_line_starts_at_its_first_frame():
    """HF v5: stderr's bar line, never ended, got the header; stdout's step lines came before its frames."""
    lines = [" 19%|██▉  | 42/216 [12:26<44:50, 15.46s/it]Traceback (most recent call last):",
             "step=40 | loss=0.195285 | lr=1.886528e-04",
             '  File "/workspace/train_qwen.py", line 346, in <module>',
             "    main()",
             "KeyboardInterrupt"]
    reading = ["Traceback (most recent call last):", *lines[1:]]  # what evidence passes: the glued text
    assert find_crashes(reading)[-1].line_index == 2


@pytest.mark.parametrize("line, rest", [
    # detectron2 puts the level before its stamp; a markdown paste may bold it (misc-detectron2-oom-after-22-iterations).
    # The logger's name inside the stamp's bracket goes with it (round 10: Swin's `[stamp ViT-B/16]`).
    ("**ERROR [06/09 11:05:25 d2.engine.train_loop]**: Exception during training:", "Exception during training:"),
    ("WARNING [06/09 11:05:25 d2.engine.hooks]: Overall training speed", "Overall training speed"),
    ("[06/09 11:05:25 d2.engine.hooks]: Total training time: 0:01:02", "Total training time: 0:01:02"),
    ("Epoch 06/09 loss 0.1", "Epoch 06/09 loss 0.1"),  # no stamp: kept
])
def test_a_stamp_after_its_level_is_no_step(line, rest):
    assert strip_stamp(line) == rest


# hf-axolotl-death-signal-sighup-step51 and hf-axolotl-sigterm-traceback-step272: the crash glued after the bar's last
# frame (stderr's \r lost) ends the run there; neither is a clean end nor a silent stop.
GLUED = [
    ("death-signal",
     "{'loss': 0.151, 'grad_norm': 0.0081498883664608, 'learning_rate': 4.749498997995992e-06, 'epoch': 0.29}\n\n"
     " 10%|▉         | 51/525 [2:12:20<20:11:06, 153.30s/it]W1221 17:13:59.240000 46660 torch/distributed/elastic/agent/"
     "server/api.py:704] Received 1 death signal, shutting down workers\n"
     "W1221 17:13:59.241000 46660 torch/distributed/elastic/multiprocessing/api.py:897] Sending process 46807 closing signal SIGHUP\n",
     "SIGHUP"),
    ("cut-traceback",
     "{'loss': 1.2749, 'learning_rate': 0.00019993683061240205, 'epoch': 0.05}        \n"
     "  1%|▍                                   | 272/22292 [03:40<4:26:46,  1.38it/s]Traceback (most recent call last):\n"
     '  File "/home/david/miniconda3/envs/axo3/bin/accelerate", line 8, in <module>\n'
     "    sys.exit(main())\n",
     "272/22292"),
]


@pytest.mark.parametrize("log, said", [g[1:] for g in GLUED], ids=[g[0] for g in GLUED])
def test_a_crash_glued_after_the_last_frame_ends_the_run(log, said):
    v = diagnose(evidence(log, age=300, writers=()), Run())
    assert (v.phase, v.level) == (Phase.CRASHED, Level.CRIT) and said in v.headline and "finished" not in v.headline, v.headline


# misc-sb3-ppo-logger-table-3584-timesteps: stable-baselines3's logger prints its numbers as a key/value table.
SB3_TABLE = """-----------------------------------------
| time/                   |             |
|    fps                  | 26          |
|    iterations           | {it}           |
|    time_elapsed         | 136         |
|    total_timesteps      | {ts}        |
| train/                  |             |
|    approx_kl            | 0.010918302 |
|    entropy_loss         | -14.2       |
|    learning_rate        | 0.0002      |
|    loss                 | {loss}        |
|    n_updates            | 18          |
|    value_loss           | 36.8        |
-----------------------------------------"""


@pytest.mark.parametrize("blocks", [[(7, 3584, 20.1)], [(6, 3072, 22.4), (7, 3584, 20.1)]], ids=["one block", "recurring"])
def test_a_key_value_table_is_one_report(blocks):
    lines = "\n".join(SB3_TABLE.format(it=it, ts=ts, loss=loss) for it, ts, loss in blocks).split("\n")
    step = read_progress(lines).steps[-1]
    assert (step.step, step.counter, step.loss, step.index) == (3584, "total_timesteps", 20.1, len(lines) - 1)


def test_rows_between_rules_that_are_no_key_value_table_stay_lines():
    lines = ["-" * 41, "| Name | Type | Params |", "| 0 | model | 1.2 M |", "-" * 41]  # three columns: not a table of pairs
    assert fold_tables(lines) == lines


# dist-torchrun-elastic-agent-error-on-rerendezvous: the worker group failed, the agent restarted it, then its own
# rendezvous raised (the log ends in that traceback's frames): the relaunch's failure ends the run.
ELASTIC = (
    "E0213 12:07:20.086000 870572 torch/distributed/elastic/multiprocessing/api.py:869] failed (exitcode: 1) local_rank: 0"
    " (pid: 876053) of binary: /usr/bin/python3.11\n"
    "I0213 12:07:20.086000 870572 torch/distributed/elastic/agent/server/api.py:889] [default] Worker group FAILED. 3/3"
    " attempts left; will restart worker group\n"
    "I0213 12:07:20.086000 870572 torch/distributed/elastic/agent/server/api.py:699] [default] Stopping worker group\n"
    "I0213 12:07:20.087000 870572 torch/distributed/elastic/agent/server/api.py:677] [default] Rendezvous'ing worker group\n"
    "Traceback (most recent call last):\n"
    '  File "/usr/local/google/home/kiuk/.pyenv/versions/venv311/bin/torchrun", line 8, in <module>\n'
    "    sys.exit(main())\n")


def test_a_relaunch_that_fails_in_its_turn_ends_the_run():
    v = diagnose(evidence(ELASTIC, age=300, writers=()), Run())
    assert (v.phase, v.level) == (Phase.CRASHED, Level.CRIT), v.headline
