"""Issue 20, classes 3-6, table-driven over real lines: a frozen start is a hang, an end is told from an
interrupt by structure, a launcher's report is named by its cause, and live anomalies (fp16 overflow at
the scaler's floor, a restart) are said. Each line comes from a public log (its source beside it); whole
logs of each class are cases in tests/fixtures/public/."""

from __future__ import annotations

from pathlib import Path

import pytest

from bot.core.bars import frames
from bot.core.crashes import find_crashes
from bot.core.diagnose import diagnose
from bot.core.facts import Kind
from bot.core.markers import END_WORDS, Mark, find_markers
from bot.core.stages.activity import activity
from bot.core.stages.findings import loss_scale
from bot.core.stages.freshness import allowed_before_first_step, seconds_per_item, standing
from bot.core.verdict import Finding, Level, Phase, Worry
from tests.builders import evidence
from tests.test_diagnose import Run

NOBODY: tuple = ()

# --- class 5: the cause, not the symptom -----------------------------------------------------------------

CAUSES = [
    # (source, lines, kind, rank, exit code, words the crash's message or hint must hold)
    ("kohya_ss#2535: accelerate's simple_launcher",
     ["    raise subprocess.CalledProcessError(returncode=process.returncode, cmd=cmd)",
      "subprocess.CalledProcessError: Command '['/workspace/kohya_ss/venv/bin/python3', '/workspace/kohya_ss/sd-scripts/"
      "sdxl_train_network.py', '--config_file', '/workspace/kohya_ss/lora2/model/config_lora-20240525-231525.toml']' died "
      "with <Signals.SIGKILL: 9>."], Kind.CHILD_FAILED, None, -9, ("sdxl_train_network.py", "SIGKILL")),
    ("RunxinXu/GIT#1: torch.distributed.launch's old launcher, a rank's exit status",
     ["subprocess.CalledProcessError: Command '['/opt/anaconda3/envs/Doc2edag/bin/python', '-u', 'run_dee_task.py', "
      "'--local_rank=1', '--resume_latest_cpt', 'True', '--save_cpt_flag', 'True', '--data_dir', './Data', '--exp_dir', "
      "'./Exps', '--task_name', 'try', '--num_train_epochs', '50', '--train_batch_size', '64', '--gradient_accumulation_steps', "
      "'8', '--eval_batch_size', '2', '--cpt_file_name', 'GIT']' returned non-zero exit status 1."],
     Kind.CHILD_FAILED, 1, 1, ("run_dee_task.py",)),
    ("accelerate#1214: the agent's line in rich logging (indented)",
     [" ERROR    failed (exitcode: -9) local_rank: 5 (pid: 22) of  api.py:673", " binary: /opt/conda/bin/python "],
     Kind.CHILD_FAILED, 5, -9, ("SIGKILL",)),
    ("hkchengrex/STCN#132: a DataLoader worker's bus error, as the main process raises it",
     ["Traceback (most recent call last):", '  File "train.py", line 1, in <module>',
      "RuntimeError: DataLoader worker (pid 46794) is killed by signal: Bus error. It is possible that dataloader's workers "
      "are out of shared memory. Please try to raise your shared memory limit."],
     Kind.FATAL, None, None, ("DataLoader worker (pid 46794)", "SIGBUS", "shared memory")),
    ("GOATmessi8/RFBNet#77: DataLoader's own line for it",
     ["ERROR: Unexpected bus error encountered in worker. This might be caused by insufficient shared memory (shm)."],
     Kind.FATAL, None, None, ("DataLoader worker bus error", "shared memory")),
    ("mlfoundations/open_clip#1087: an aborted communicator whose reason is the timeout",
     ["RuntimeError: : NCCL communicator was aborted on rank 3.  Original reason for failure was: [Rank 3] Watchdog caught "
      "collective operation timeout: WorkNCCL(SeqNum=266392, OpType=ALLGATHER, Timeout(ms)=1800000) ran for 1803169 "
      "milliseconds before timing out."], Kind.NCCL_TIMEOUT, 3, None, ("ALLGATHER", "1803169 ms")),
    ("q1park/tempformer-xl: a KeyboardInterrupt handler's words", ["Exiting from training early"],
     Kind.INTERRUPTED, None, None, ("Exiting from training early",)),
]


@pytest.mark.parametrize(("lines", "kind", "rank", "code", "said"), [pytest.param(*c[1:], id=c[0]) for c in CAUSES])
def test_a_crash_is_named_by_its_cause(lines, kind, rank, code, said):
    crash = find_crashes(lines)[-1]
    assert (crash.kind, crash.rank, crash.exit_code) == (kind, rank, code)
    text = f"{crash.message} {crash.signal_hint or ''}"
    assert all(s in text for s in said), crash


HEADLINES = [
    # (source, log, must hold, must not)
    ("meta-llama/llama#856: the agent's -9, then torchrun's traceback cut before its exception line",
     "[2023-10-13 17:40:02,544] torch.distributed.elastic.multiprocessing.api: [ERROR] failed (exitcode: -9) local_rank: 0 "
     "(pid: 62498) of binary: /home/znr/miniconda3/envs/llama/bin/python\nTraceback (most recent call last):\n"
     '  File "/home/znr/miniconda3/envs/llama/bin/torchrun", line 8, in <module>\n    sys.exit(main())\n',
     ("rank 0 killed by SIGKILL", "OOM killer"), ("a Python exception",)),
    ("GOATmessi8/RFBNet#77: the bus error, then the main process's traceback cut short",
     "Training RFB_vgg on VOC0712\nERROR: Unexpected bus error encountered in worker. This might be caused by insufficient "
     'shared memory (shm).\nTraceback (most recent call last):\n  File "train_RFB.py", line 257, in <module>\n    train()\n',
     ("DataLoader worker bus error", "shared memory in /dev/shm"), ("a Python exception",)),
]


def test_a_sigterm_nemo_prints_at_start_up_is_no_crash():
    """NeMo under SLURM prints Lightning's signal line while it starts and trains on (a NeMo workshop's notes in
    the code index quote it): before the first step it must not read as crashed."""
    v = diagnose(evidence("[rank: 0] Received SIGTERM: 15\n[rank: 0] Received SIGTERM: 15\n", age=30), Run())
    assert v.phase is Phase.STARTING and v.level is Level.NOTE, v.headline


@pytest.mark.parametrize(("log", "holds", "lacks"), [pytest.param(*h[1:], id=h[0]) for h in HEADLINES])
def test_the_headline_names_the_cause(log, holds, lacks):
    v = diagnose(evidence(log, age=120, writers=NOBODY), Run())
    assert v.phase is Phase.CRASHED and all(h in v.headline for h in holds) and not any(x in v.headline for x in lacks), v.headline


# NVIDIA-NeMo/Speech#8441: NeMo's bar, the watchdog's timeout glued to its last frame, then other ranks' timeouts.
NEMO_TIMEOUT = (
    "Epoch 0:   6%|██                               | 32040/500150 [6:28:43<94:39:17,  1.37it/s, loss=2.6, v_num=95nc, "
    "reduced_train_loss=2.590, global_step=3.2e+4, consumed_samples=2.56e+7][E ProcessGroupNCCL.cpp:458] [Rank 0] Watchdog "
    "caught collective operation timeout: WorkNCCL(SeqNum=96120, OpType=ALLREDUCE, Timeout(ms)=1800000) ran for 25624887 "
    "milliseconds before timing out.\n"
    "[E ProcessGroupNCCL.cpp:458] [Rank 7] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=64088, "
    "OpType=ALLREDUCE, Timeout(ms)=1800000) ran for 25625251 milliseconds before timing out.\n")


@pytest.mark.parametrize("writers", [NOBODY, ((692, 40, "python3 train.py"),)], ids=["gone", "alive"])
def test_an_nccl_timeout_glued_to_the_bar_is_no_live_training(writers):
    v = diagnose(evidence(NEMO_TIMEOUT, age=60, writers=writers), Run())
    assert (v.phase, v.level) == (Phase.CRASHED, Level.CRIT) and "rank 0: NCCL collective timeout" in v.headline, v.headline


def test_a_timeout_is_the_cause_of_the_other_ranks_aborted_communicators():
    """pytorch's DistBackendError on a rank whose communicator the watchdog aborted names no cause; the rank that timed
    out, later in the log, does (real lines: the abort as an FSDP run printed it, quoted in an analysis note in the code
    index; the timeout from BinItAI/visdet#14)."""
    log = ("Traceback (most recent call last):\n"
           '  File "train.py", line 1, in <module>\n'
           "torch.distributed.DistBackendError: NCCL communicator was aborted on rank 1.\n"
           "[E ProcessGroupNCCL.cpp:828] [Rank 2] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=2511984, "
           "OpType=ALLREDUCE, Timeout(ms)=1800000) ran for 1809826 milliseconds before timing out.\n")
    doing = activity(evidence(log, writers=NOBODY))
    assert doing.crash.kind is Kind.NCCL_TIMEOUT and doing.crash.rank == 2


# --- class 4: an end is structure; an interrupt's summary is no end ---------------------------------------

# One real line for every entry of markers.END_WORDS (each from the source its comment names).
END_LINES = [
    # round 4's (tests/fixtures/round4): Flower's server, a CatBoost script, a PINN script's last line
    "INFO :      Run finished 5 rounds in 22.28s",
    "model.fit... done",
    "Total Execution Time: 415.10 seconds",
    # round 5's: Caffe's solver
    "I0605 15:55:00.132752 12509 solver.cpp:100] Optimization Done.",
    # round 6's: LSF's job report (misc-wandb-lsf-t5-mimic-successfully-completed); PyCharm's run console
    # (a clean exit's line, the same console whose `exit code -1073741819` misc-megengine-hdr-… crashed with)
    "Successfully completed.",
    "Process finished with exit code 0",
    "[2022-11-22 11:27:14,442] [INFO] [launch.py:350:main] Process 29248 exits successfully.",
    "[after training is done] datetime: 2026-03-20 19:41:47 ",
    "Epoch 3: 100%|██████████| 6104/6104 [00:36<00:00, 166.90it/s, v_num=0]`Trainer.fit` stopped: `max_epochs=4` reached.",
    "{'train_runtime': 246.2454, 'train_samples_per_second': 7.2, 'train_steps_per_second': 0.902, 'train_loss': "
    "0.742836398852838, 'epoch': 3.0}",
    "Training completed. Do not forget to share your model on huggingface.co/models =)",
    "2021-09-03 20:47:31.106 | INFO     | yolox.core.trainer:after_train:184 - Training of experiment is done and the best AP is 90.00",
    "| End of training | test loss  3.62 | test ppl    37.262",
    "[08/30 23:53:52] d2.engine.hooks INFO: Overall training speed: 3998 iterations in 0:29:05 (0.4365 s / it)",
    "300 epochs completed in 2.874 hours.",
    "End training....",
    "Job execution was successful. Exit Status 0. ",
    "  3/234 [..............................] - ETA: 33:37:24 - loss: 44.4110Batch 3: Invalid loss, terminating training",
    "Epoch 8: early stopping",
    # round 8's (tests/fixtures/round8): TPOT's result; round 9's: PaddleVideo's, a Portuguese QLoRA script's;
    # gpu-jobs4's JSON-lines loop
    "Best pipeline: BernoulliNB(KNeighborsClassifier(input_matrix, n_neighbors=41, p=1, weights=uniform), alpha=0.01, fit_prior=True)",
    "[12/25 15:48:20] training Res18 finished",
    "2025-01-08 16:30:31,730 - INFO - Treinamento concluído com sucesso",
    '{"event": "done", "steps": 150, "elapsed": 20.2}',
    # round 10's: MLatom's
    " FINAL ML MODEL CREATED AND SAVED",
    # round 11's: skorch's EarlyStopping, Ray Tune's status once every trial ended, OCP's early stop
    "Stopping since valid_loss has not improved in the last 3 epochs.",
    "Number of trials: 2/2 (2 TERMINATED)",
    "2023-11-16 08:13:15 (INFO): Early stopping due to low learning rate",
]


@pytest.mark.parametrize("line", END_LINES)
def test_every_end_line_is_an_end(line):
    assert [m.kind for m in find_markers([line])] == [Mark.ENDED], line


def test_every_entry_of_the_end_table_has_a_real_line():
    import re

    for pattern, source in END_WORDS:
        assert any(re.search(f"(?i){pattern}", line) for line in END_LINES) or "custom" in source, (pattern, source)


ENDS = [
    # (source, log, writer alive?, phase, level, must hold, must not)
    ("keras-team/keras#20323: Keras 3's early stopping (no word the prefilter knew)",
     "Epoch 7/50\n1/1 ━━━━━━━━━━━━━━━━━━━━ 0s 144ms/step - loss: 38.8818 - learning_rate: 0.1000\nEpoch 8/50\n"
     "1/1 ━━━━━━━━━━━━━━━━━━━━ 0s 167ms/step - loss: 48.5781 - learning_rate: 0.1000\nEpoch 8: early stopping\n"
     "Restoring model weights from the end of the best epoch: 6.\n", False, Phase.FINISHED, Level.OK, "early stopping", "killed?"),
    ("q1park/tempformer-xl: the KeyboardInterrupt handler, then the test run and 'End of training'",
     "| epoch   3 step    93800 |   7776 batches | lr 0.000137 | ms/batch 497.40 | loss  3.81 | ppl    44.955\n"
     "| epoch   3 step    94000 |   7976 batches | lr 0.000137 | ms/batch 497.29 | loss  3.74 | ppl    42.176\n"
     + "-" * 100 + "\nExiting from training early\n" + "=" * 100 + "\n| End of training | test loss  3.62 | test ppl    37.262\n"
     + "=" * 100 + "\n", False, Phase.CRASHED, Level.CRIT, "interrupted — Exiting from training early", "finished"),
]


@pytest.mark.parametrize(("log", "alive", "phase", "level", "holds", "lacks"), [pytest.param(*e[1:], id=e[0]) for e in ENDS])
def test_an_end_is_told_from_an_interrupt(log, alive, phase, level, holds, lacks):
    v = diagnose(evidence(log, age=300, **({} if alive else {"writers": NOBODY})), Run())
    assert (v.phase, v.level) == (phase, level) and holds in v.headline and lacks not in v.headline, v.headline


# --- class 3: the loading grace is for loading that moves ---------------------------------------------------

BARS = [
    # (source, frame, seconds per item by its own rate, what it had stood when drawn)
    ("hiyouga/LlamaFactory#8584: a tokenizer bar that never moved",
     "Running tokenizer on dataset (num_proc=16):   0%|          | 0/77976 [00:00<?, ? examples/s]", None, 0.0),
    ("lm-sys/FastChat#587: shards stuck an hour", "Loading checkpoint shards:   0%|      | 0/3 [00:00<?, ?it/s]", None, 0.0),
    ("modelscope/ms-swift#417: shards loading at 17 s each",
     "Loading checkpoint shards: 21%|██ | 4/19 [01:06<04:11, 16.76s/it]", 16.76, None),
    ("an SFD (OpenPCDet) error paste in the code index: an epoch bar drawn at 0 after 9 s",
     "epochs:   0%|                                              | 0/80 [00:09<?, ?it/s, loss=nan, lr=0.001]", None, 9.0),
]


@pytest.mark.parametrize(("frame", "per_item", "stood"), [pytest.param(*b[1:], id=b[0]) for b in BARS])
def test_a_bar_says_whether_it_moves(frame, per_item, stood):
    bar = frames(frame)[-1]
    assert seconds_per_item(bar) == (pytest.approx(per_item) if per_item else None)
    ev = evidence(frame, age=600)
    assert standing(ev, bar) == pytest.approx(600 + stood) if stood is not None else standing(ev, bar) == pytest.approx(600)


def test_only_a_bar_whose_items_take_long_keeps_the_grace():
    # ms-swift#417's real frame; the slow one is tqdm's own format for a shard every 10 min (made here: no real log
    # at hand shows one), and one taking longer still.
    fast, slow, slower = (frames(f)[-1] for f in ("Loading checkpoint shards: 21%|██ | 4/19 [01:06<04:11, 16.76s/it]",
                                                  "Loading checkpoint shards: 25%|██▌       | 1/4 [09:58<29:54, 598.12s/it]",
                                                  "Loading checkpoint shards: 25%|██▌       | 1/4 [19:58<59:54, 1198.12s/it]"))
    assert allowed_before_first_step(fast, 600, 2700) == 600  # three items' time is under silence_after
    assert allowed_before_first_step(slow, 600, 2700) == pytest.approx(3 * 598.12)  # three shards' time
    assert allowed_before_first_step(slower, 600, 2700) == 2700  # never more than the grace
    assert allowed_before_first_step(None, 600, 2700) == 600  # an announcement, a chatter line, an empty log


FROZEN = [
    # (source, log, age s, phase, level)
    ("huggingface/transformers#24473: the loop's bar drawn at 0%, 1 min on",
     "[INFO|trainer.py:1680] 2023-06-26 13:43:56,492 >> ***** Running training *****\n\n  0%|\n", 60, Phase.STARTING, Level.NOTE),
    ("huggingface/transformers#24473: the same, 30 min on", "[INFO|trainer.py:1680] 2023-06-26 13:43:56,492 >> "
     "***** Running training *****\n\n  0%|\n", 1800, Phase.SILENT, Level.CRIT),
    ("hiyouga/LlamaFactory#8584: the tokenizer bar at 0, 11 min on",
     "Running tokenizer on dataset (num_proc=16):   0%|          | 0/77976 [00:00<?, ? examples/s]", 660, Phase.SILENT, Level.CRIT),
    ("modelscope/ms-swift#417: shards moving, 5 min after the last frame",
     "Loading checkpoint shards: 21%|██ | 4/19 [01:06<04:11, 16.76s/it]", 300, Phase.LOADING, Level.NOTE),
    ("an empty log, its writer alive 20 min", "", 1200, Phase.SILENT, Level.CRIT),
]


@pytest.mark.parametrize(("log", "age", "phase", "level"), [pytest.param(*f[1:], id=f[0]) for f in FROZEN])
def test_a_frozen_start_is_a_hang_within_silence_after(log, age, phase, level):
    v = diagnose(evidence(log, age=age), Run())
    assert (v.phase, v.level) == (phase, level), v.headline


# --- class 6: live anomalies ---------------------------------------------------------------------------------

SCALES = [
    # (source, lines, the scale the finding reports, or None for no finding)
    ("huggingface/transformers#14531: DeepSpeed at the scaler's floor",
     ["[2021-11-27 00:36:54,800] [INFO] [stage2.py:1628:step] [deepscale] OVERFLOW! Rank 0 Skipping step. Attempted loss "
      "scale: 1, reducing to 1"], 1.0),
    ("NVIDIA/apex#318: apex's scale fallen far below 1",
     ["Gradient overflow. Skipping step, loss scaler 0 reducing loss scale to 8.165126103939127e-202"], 8.165126103939127e-202),
    ("zai-org/CogVideo#233: DeepSpeed's search from 2**32 at the start is no finding",
     ["[2024-09-11 17:52:18,030] [INFO] [loss_scaler.py:183:update_scale] [deepspeed] OVERFLOW! Rank 0 Skipping step. "
      "Attempted loss scale: 4294967296, reducing to 2147483648"], None),
    ("LEEYOONHYUNG/BVAE-TTS#3: apex at 32768 is no finding",
     ["Gradient overflow. Skipping step, loss scaler 0 reducing loss scale to 32768.0"], None),
    ("a Megatron bf16 run: `loss scale: 1.0` with no overflow is no finding",
     [" iteration      122/  250000 | consumed samples:       124928 | elapsed time per iteration (ms): 86545.2 | learning "
      "rate: 9.150E-06 | global batch size:  1024 | lm loss: 2.504220E+00 | loss scale: 1.0 | grad norm: 0.231 | number "
      "of skipped iterations:   0 | number of nan iterations:   0 |"], None),
]


@pytest.mark.parametrize(("lines", "scale"), [pytest.param(*s[1:], id=s[0]) for s in SCALES])
def test_fp16_overflow_at_the_floor_is_a_finding(lines, scale):
    found = loss_scale(lines, ())
    assert (found.value if found else None) == scale


def test_a_loop_that_overflows_on_every_step_warns():
    log = "".join(f"  0%|▋          | {n}/24128 [00:40<2:40:10,  2.50it/s][2021-11-27 00:36:55,194] [INFO] [stage2.py:1628:step] "
                  "[deepscale] OVERFLOW! Rank 0 Skipping step. Attempted loss scale: 1, reducing to 1\n" for n in (98, 99, 100))
    v = diagnose(evidence(log, age=5), Run())
    assert (v.phase, v.level) == (Phase.TRAINING, Level.WARN) and "loss scale 1" in v.headline, v.headline
    assert Finding.LOSS_SCALE in {f.what for f in v.findings} and Worry.LOSS_SCALE in {c.kind for c in v.concerns}


RESTARTS = [
    ("shun-zheng/Doc2EDAG#24: torch.distributed.launch's agent (INFO:… logger)",
     "INFO:torch.distributed.elastic.agent.server.api:[default] Worker group FAILED. 3/3 attempts left; will restart worker group\n"
     "INFO:torch.distributed.elastic.agent.server.api:[default] Stopping worker group\n"),
    ("pytorch/pytorch#147064: torchrun's agent (glog prefix), after a worker's exit code",
     "E0213 12:07:20.086000 870572 torch/distributed/elastic/multiprocessing/api.py:869] failed (exitcode: 1) local_rank: 0 "
     "(pid: 876053) of binary: /usr/local/google/home/kiuk/.pyenv/versions/3.11.4/envs/venv311/bin/python3.11\n"
     "I0213 12:07:20.086000 870572 torch/distributed/elastic/agent/server/api.py:889] [default] Worker group FAILED. 3/3 "
     "attempts left; will restart worker group\n"
     "I0213 12:07:20.086000 870572 torch/distributed/elastic/agent/server/api.py:699] [default] Stopping worker group\n"),
]


@pytest.mark.parametrize("log", [pytest.param(r[1], id=r[0]) for r in RESTARTS])
def test_a_restarting_worker_group_is_said(log):
    v = diagnose(evidence(log, age=20), Run())
    assert (v.phase, v.level) == (Phase.STARTING, Level.WARN) and v.headline.startswith("restarting"), v.headline
    assert Worry.RESTARTING in {c.kind for c in v.concerns} and "no steps yet" not in v.headline


def test_every_announcement_in_the_corpora_holds_one_of_the_prefilter_words():
    """find_markers skips a line with none of `_WORDS` before its regexes run (most of a window's lines, most of its
    cost): that must never drop an announcement. Every line of every corpus log an announcement's or an end's regex
    would match holds one of the words."""
    from bot.core import markers
    from bot.core.grammar import message

    fixtures = Path(__file__).parent / "fixtures"
    missed = []
    for log in sorted(fixtures.glob("*/*/log")):
        for line in log.read_text(errors="replace").replace("\r", "\n").split("\n"):
            text = line.strip()
            if len(text) <= 1500 and (markers._kind(text) or markers._kind(message(text))) and not any(
                    w in line.lower() for w in markers._WORDS):
                missed.append((log.parent.name, text[:80]))
    assert missed == []


def test_each_announcement_pattern_is_tried_only_on_lines_with_its_words_and_none_is_missed():
    """_kind tries a pattern only on a line holding one of its words (markers._KINDS, END_GATE): every line of
    every corpus log the pattern matches holds one."""
    from bot.core import markers
    from bot.core.grammar import message

    patterns = [("ended", markers._ENDS, markers.END_GATE)] + [(k.value, p, w) for k, p, w in markers._KINDS]
    missed = set()
    for log in sorted((Path(__file__).parent / "fixtures").glob("*/*/log")):
        for line in log.read_text(errors="replace").replace("\r", "\n").split("\n"):
            for text in {line.strip(), message(line.strip())}:
                lowered = text.lower()
                missed |= {(name, text[:80]) for name, pattern, words in patterns
                           if len(text) <= 1500 and pattern.search(text) and not any(w in lowered for w in words)}
    assert missed == set()
