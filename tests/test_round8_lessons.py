"""Round 8's lessons, on its real logs and lines (tests/fixtures/round8/FIRST_SIGHT.txt has what was misread at first
sight; gpu-jobs3 is the same round's H200 batch): a rank's signal under torchrun, C's `-nan`, a quoted paste, a
command line's flags, argparse's refusal, two series printed together, counters by their own words (`Generation 20`,
`Trial #63`, `training_iteration: 27`), progress in percent, ends by their echo and their summaries, a sharded save."""

from __future__ import annotations

from pathlib import Path

import pytest

from bot.core.diagnose import diagnose
from bot.core.facts import Kind
from bot.core.grammar import fields, split_rank_prefix
from bot.core.verdict import Level, Phase
from bot.probe.replay import DefaultRun
from tests.builders import evidence

FIXTURES = Path(__file__).parent / "fixtures"
ALIVE = ((692, 40, "python3 train.py"),)


def log(case: str) -> str:
    return (FIXTURES / case / "log").read_text(errors="replace")


def verdict(text: str, age: float, alive: bool):
    return diagnose(evidence(text, age=age, writers=ALIVE if alive else ()), DefaultRun("r"))


# --- who failed first: torchrun's root cause, a signal ----------------------------------------------------------

def _torchrun_log(job: str) -> str:
    return (FIXTURES / "gpu-jobs3" / "logs" / job / "train.log").read_text()


def test_a_rank_sigkilled_under_torchrun_is_the_cause_not_its_peers_lost_connection():
    v = verdict(_torchrun_log("ddp-hang"), 3, alive=False)
    assert v.phase is Phase.CRASHED and "rank 1 killed by SIGKILL" in v.headline and "Connection closed" not in v.headline


def test_a_rank_that_raised_under_torchrun_is_named_by_its_own_error():
    """The guard: rank 1's own OutOfMemoryError is in the log, so it is the cause, not torchrun's exit code 1."""
    v = verdict(_torchrun_log("ddp-oom"), 3, alive=False)
    assert v.phase is Phase.CRASHED and "rank 1" in v.headline and "OutOfMemoryError" in v.headline


# --- numbers as C and shells print them ---------------------------------------------------------------------------

@pytest.mark.parametrize("text,key", [("[50]\ttrain-logloss:-nan\ttrain-auc:0.875924", "train-logloss"),
                                       ("loss=+inf lr=0.1", "loss"), ("loss: -inf", "loss")])
def test_a_signed_nan_or_inf_is_named_by_its_key(text, key):
    [f] = [f for f in fields(text) if f.key == key]
    assert f.value != f.value or abs(f.value) == float("inf")


def test_xgboost_s_nan_train_loss_is_seen_though_its_rounds_are_counted_on_other_lines():
    v = verdict(log("round8/cv-xgboost-gblinear-nan-logloss"), 5, alive=True)
    assert (v.phase, v.level) == (Phase.TRAINING, Level.WARN) and "NaN" in v.headline


def test_a_command_line_flag_is_a_setting_not_a_counter():
    text = 'Command "/usr/local/bin/python3.7 train.py --batch_size 500 --epochs 30 --learning_rate 0.01"'
    assert [f.key for f in fields(text)] == ["--batch_size", "--epochs", "--learning_rate"]
    assert [f.key for f in fields("train-loss 3 --lr=0.1")] == ["train-loss", "--lr"]


def test_a_quoted_paste_is_read_as_the_log_it_quotes():
    v = verdict(log("round8/misc-autogluon-tabular-brokenpipe"), 180, alive=False)
    assert v.phase is Phase.CRASHED and "BrokenPipeError" in v.headline
    v = verdict(log("round8/misc-sagemaker-tf-userscript-error"), 300, alive=False)
    assert v.phase is Phase.CRASHED and "ExecuteUserScriptError" in v.headline and "epoch 30" not in v.headline


def test_argparse_s_refusal_below_its_usage_is_a_crash():
    v = verdict(log("round8/llm-chatglm-efficient-tuning-argparse-fp16"), 180, alive=False)
    assert v.phase is Phase.CRASHED and "argument --fp16" in v.headline
    alone = "train.py: error: argument --fp16: expected one argument\n"  # no usage block: no argparse
    assert evidence(alone).crashes == ()


# --- counters by their own words ----------------------------------------------------------------------------------

@pytest.mark.parametrize("case,age,says", [
    ("round8/misc-tpot-generation20-live", 60, "generation 20"),  # `Generation 20 - Current best internal CV score`
    ("round8/misc-keras-tuner-bayes-trial63", 20, "trial 63"),  # `Search: Running Trial #63`
    ("round8/misc-rllib-ppo-k8s-iter27", 20, "iteration 27"),  # RLlib's YAML result, `training_iteration: 27`
    ("round8/llm-gensim-word2vec-epoch1", 15, "24.71%"),  # `EPOCH 1 - PROGRESS: at 24.71% examples`
    ("round6/llm-fasttext-json-progress-64.8-percent", 5, "64.8%"),  # fastText's `{"progress":64.8,…}`
])
def test_a_loop_is_named_by_what_it_counts(case, age, says):
    v = verdict(log(case), age, alive=True)
    assert (v.phase, v.level) == (Phase.TRAINING, Level.OK) and says in v.headline, v.headline


def test_an_accuracy_in_percent_that_rises_is_no_progress():
    lines = "".join(f"epoch {e} acc: {50 + e}.5%\n" for e in range(1, 6))
    assert [s.percent for s in evidence(lines).steps] == [None] * len(evidence(lines).steps)


def test_parlai_s_rank_prefix_is_a_rank():
    assert split_rank_prefix("[rank:  1] [ running eval: valid ]") == (1, "[ running eval: valid ]")
    v = verdict(log("round8/llm-parlai-multiprocess-running-eval"), 10, alive=True)
    assert v.phase is Phase.EVALUATING and "valid" in v.headline


# --- ends, by their echo and their summaries ---------------------------------------------------------------------

@pytest.mark.parametrize("case,age,says", [
    ("round8/llm-tallrec-alpaca-lora-finished-early", 600, "1920/3200"),  # HF's metrics dict, wrapped, then tqdm's close
    ("round8/misc-tpot-best-pipeline", 120, "BernoulliNB"),  # `Best pipeline: …`
    ("round8/misc-autogluon-timeseries-complete", 60, "AutoGluonTabular"),  # `Training complete.` then `Best model: …`
    ("round8/cv-mmpretrain-resnet50-fruit30-test", 300, "92.5983"),  # the test pass's last line, in its own words
])
def test_a_clean_end_says_what_it_ended_with(case, age, says):
    v = verdict(log(case), age, alive=False)
    assert (v.phase, v.level) == (Phase.FINISHED, Level.OK) and says in v.headline, v.headline


def test_a_save_written_shard_by_shard_is_under_way_until_its_last_shard():
    v = verdict(log("round8/llm-torchtune-70b-multinode-saving-shards"), 15, alive=True)
    assert v.phase is Phase.SAVING and "shard 13/30" in v.headline
    last = "Model checkpoint of size 4.66 GiB saved to /out/epoch_0/ft-model-00030-of-00030.safetensors\n"
    assert verdict(last, 15, alive=True).phase is not Phase.SAVING  # the last shard written: the save is over


def test_a_long_exception_type_gives_way_to_its_message():
    v = verdict(log("round8/cv-gpt-sovits-s2-lora-spawn-exit"), 180, alive=False)
    assert v.phase is Phase.CRASHED and "3221225620" in v.headline
    [crash] = [c for c in evidence(log("round8/cv-gpt-sovits-s2-lora-spawn-exit")).crashes if c.exc_type]
    assert crash.kind is Kind.TRACEBACK
