"""Step lines, tqdm bars, crash signatures and phase announcements, on real and realistic logs."""

from __future__ import annotations

import math
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.standins import REAL_FIXTURES
from hypothesis import given, settings
from hypothesis import strategies as st

from bot.core.facts import Crash
from bot.core.crashes import find_crashes
from bot.core.markers import Mark, find_markers
from bot.core.formats import last_bar_frame, parse_bar, parse_step, step_grep_ere

REAL = REAL_FIXTURES
R, G, Y, B, C, M, X = (f"\x1b[{n}m" for n in (31, 32, 33, 34, 36, 35, 39))


def read_real(name: str) -> str:
    with open(REAL / name, encoding="utf-8", newline="") as f:  # newline="": keep the bars' \r
        return f.read()


def split(text: str) -> list[str]:
    return re.split(r"\r\n|\r|\n", text)


def matches(obj: object, expected: dict) -> None:
    # `fmt` named which hand-written recogniser matched; since the redesign one grammar reads every
    # format, so the rows keep what the line says (step, loss, rate…) and drop that name.
    for key, want in expected.items():
        if key == "fmt" and want != "custom":
            continue
        got = getattr(obj, key)
        if isinstance(want, float) and math.isnan(want):
            assert got is not None and math.isnan(got), key
        elif isinstance(want, float):
            assert got == pytest.approx(want), (key, got)
        else:
            assert got == want, (key, got)


# (line, expected fields). A key left out may hold anything.
STEPS = [
    # plain key=value, the form of the real fixtures
    ("step=2 loss=10.7923 tok/s=41324 elapsed=3.4s", dict(fmt="kv", step=2, loss=10.7923, rate=41324.0, rate_unit="tok/s", elapsed=3.4)),
    ("step: 12 loss: 2.31 it/s: 3.4", dict(fmt="kv", step=12, loss=2.31, rate=3.4, rate_unit="it/s")),
    ("[rank3]: step=5 loss=2.1 lr=1e-4", dict(fmt="kv", step=5, loss=2.1, rate=None, line="[rank3]: step=5 loss=2.1 lr=1e-4")),
    ("[default0]:step=100 loss=nan tok/s=40000", dict(fmt="kv", step=100, loss=float("nan"), rate=40000.0)),
    ("2024-06-01 12:00:00 INFO train.py:88 - step 300/10000 | loss 1.987 | lr 2.9e-4 | 41.3k tok/s",
     dict(fmt="kv", step=300, total=10000, loss=1.987, rate=41300.0, rate_unit="tok/s")),
    ("step=10 loss=1.0 samples/s=512.5 elapsed=00:01:05", dict(fmt="kv", step=10, rate=512.5, rate_unit="samples/s", elapsed=65.0)),
    ("global_step=200 train/loss=1.5 train/tokens_per_sec=30,000", dict(fmt="kv", step=200, loss=1.5, rate=30000.0, rate_unit="tok/s")),
    ("Epoch [1/3], Step [100/1000], Loss: 2.3456", dict(fmt="kv", step=100, total=1000, loss=2.3456, epoch=1.0)),
    ("step    1/74: train loss 4.367631 (acc 4.367631) (1162.215469 ms, 440534 tok/s)",  # llm.c
     dict(fmt="kv", step=1, total=74, loss=4.367631, rate=440534.0)),
    ("step:100/1770 train_time:12345ms step_avg:123.45ms", dict(fmt="kv", step=100, total=1770, loss=None)),  # modded-nanogpt
    ("[2024-01-10 12:00:00,000] [INFO] [logging.py:96:log_dist] [Rank 0] step=10, skipped=0, lr=[0.0001], mom=[(0.9, 0.999)]",
     dict(fmt="kv", step=10)),  # DeepSpeed
    ("epoch=0/micro_step=800/global_step=100, RunningAvgSamplesPerSec=51.2, CurrSamplesPerSec=50.1, MemAllocated=12.3GB",
     dict(fmt="kv", step=100, rate=51.2, rate_unit="samples/s", epoch=0.0)),
    ("loss=2.31 tok/s=14213", dict(fmt="kv", step=None, loss=2.31, rate=14213.0)),
    ("step 5 | loss 3.2 | 2.50s/it", dict(fmt="kv", step=5, rate=0.4, rate_unit="it/s")),
    ("steps: 100 loss: 2.3456 iter time (s): 1.234 samples/sec: 12.345",  # DeepSpeed pipeline engine
     dict(fmt="kv", step=100, loss=2.3456, rate=12.345, rate_unit="samples/s")),
    ("2024-01-01 12:00:00 | INFO | train_inner | epoch 001:    100 / 1000 loss=5.123, nll_loss=4.5, ppl=22.6, wps=12345.6, ups=1.2, "
     "num_updates=100, lr=0.0001, gnorm=1.2, train_wall=30, wall=120", dict(fmt="kv", step=100, loss=5.123, rate=12345.6)),  # fairseq
    ("completed step: 100, seconds: 1.234, TFLOP/s/device: 123.4, Tokens/s/device: 12345.6, total_weights: 65536, loss: 2.345",
     dict(fmt="kv", step=100, loss=2.345, rate=12345.6, rate_unit="tok/s")),  # MaxText
    ("[0/0] iteration: 100 / 1000 | consumed_tokens: 1.2M | elapsed_time_per_iteration_ms: 500 | tokens_per_sec: 100K | "
     "tokens_per_sec_per_gpu: 12.5K | lm_loss: 2.3 | lr: 0.0003 | grad_norm: 0.5", dict(fmt="kv", step=100, total=1000, loss=2.3, rate=100000.0)),
    ("Epoch 0 | Step 100 | Loss 2.3456 | LR 3.00e-04 | 12345 tok/s", dict(fmt="kv", step=100, loss=2.3456, epoch=0.0, rate=12345.0)),
    # Hugging Face Trainer (and JSON-lines loggers)
    ("{'loss': 2.31, 'grad_norm': 1.2, 'learning_rate': 5e-05, 'epoch': 0.12}", dict(fmt="hf", step=None, loss=2.31, epoch=0.12)),
    ("{'loss': 1.2345, 'grad_norm': 0.5, 'learning_rate': 2e-05, 'num_tokens': 123456.0, 'mean_token_accuracy': 0.71, 'epoch': 0.05}",
     dict(fmt="hf", loss=1.2345, epoch=0.05)),  # TRL SFT
    ('{"step": 100, "loss": 2.31, "lr": 0.0003}', dict(fmt="hf", step=100, loss=2.31)),
    ("[rank0]: {'loss': '0.8123', 'grad_norm': '3.1', 'epoch': '0.5', 'step': 40}", dict(fmt="hf", step=40, loss=0.8123, epoch=0.5)),
    # torchtitan, ANSI colours and the [titan] logger prefix
    (f"{R}step: 10  {G}loss:  7.1234  {Y}memory: 30.12GiB(38.02%)  {B}tps: 14,213  {C}tflops: 123.45  {M}mfu: 12.3%{X}",
     dict(fmt="torchtitan", step=10, loss=7.1234, rate=14213.0, rate_unit="tok/s",
          line="step: 10  loss:  7.1234  memory: 30.12GiB(38.02%)  tps: 14,213  tflops: 123.45  mfu: 12.3%")),
    (f"[rank0]:[titan] 2025-01-10 12:00:00,123 - root - INFO - {R}step:  1  {G}loss: 12.2581  {Y}grad_norm:  3.4512  "
     f"{Y}memory: 42.12GiB(44.34%)  {B}tps: 1,234  {C}tflops: 56.78  {M}mfu: 5.74%{X}", dict(fmt="torchtitan", step=1, rate=1234.0)),
    ("step: 200  loss:  4.5123  memory: 30.12GiB(38.02%)  wps: 5,432  mfu: 31.20%", dict(fmt="torchtitan", step=200, rate=5432.0)),
    # Megatron-LM, Megatron-DeepSpeed, NeMo
    (" iteration       10/    1000 | consumed samples: 640 | elapsed time per iteration (ms): 1234.5 | learning rate: 1.0E-04 | "
     "global batch size: 64 | lm loss: 7.399415E+00 | loss scale: 1.0 |",
     dict(fmt="megatron", step=10, total=1000, loss=7.399415, rate=None)),
    (" [2024-05-01 10:00:00] iteration      100/  500000 | consumed samples:        51200 | elapsed time per iteration (ms): 2145.3 | "
     "throughput per GPU (TFLOP/s/GPU): 402.1 | learning rate: 1.500000E-04 | global batch size:   512 | lm loss: 4.123456E+00 | "
     "loss scale: 1.0 | grad norm: 0.873 | number of skipped iterations:   0 | number of nan iterations:   0 |",
     dict(fmt="megatron", step=100, total=500000, loss=4.123456, rate=402.1, rate_unit="TFLOP/s/GPU")),
    (" iteration       10/  292968 | consumed samples:         1280 | consumed tokens:      2621440 | elapsed time per iteration (ms): 1234.5 | "
     "learning rate: 1.000E-04 | global batch size:   128 | lm loss: 9.876543E+00 | loss scale: 4096.0 | grad norm: 3.123 | "
     "samples per second: 103.686 | tokens per gpu per second (tgs): 26543.616 | TFLOPs: 123.45 |",
     dict(fmt="megatron", step=10, loss=9.876543, rate=26543.616, rate_unit="tok/s/GPU")),
    (" iteration        1/    1000 | consumed samples:           64 | elapsed time per iteration (ms): 20000.0 | learning rate: 0.000000E+00 | "
     "global batch size:    64 | loss scale: 4294967296.0 | number of skipped iterations:   1 | number of nan iterations:   0 |",
     dict(fmt="megatron", step=1, loss=None)),
    ("[NeMo I 2024-06-01 12:00:00 utils:1] Training epoch 0, iteration 10/999 | lr: 0.0001 | global_batch_size: 64 | global_step: 10 | "
     "reduced_train_loss: 7.4 | train_step_timing in s: 1.23 | consumed_samples: 640",
     dict(fmt="megatron", step=10, total=999, loss=7.4)),
    # nanoGPT
    ("iter 10: loss 4.2345, time 120.45ms, mfu 31.20%", dict(fmt="nanogpt", step=10, loss=4.2345)),
    ("iter 0: loss 10.9823, time 21345.67ms, mfu -100.00%", dict(fmt="nanogpt", step=0, loss=10.9823)),
    ("step 2000: train loss 1.1234, val loss 1.4567", dict(fmt="nanogpt", step=2000, loss=1.1234)),
    # Lightning (tqdm and rich), and tqdm training bars that carry a loss
    ("Epoch 3:  45%|████▌     | 450/1000 [00:30<00:37, 14.80it/s, train_loss=0.123]",
     dict(fmt="lightning", step=450, total=1000, epoch=3.0, rate=14.8, rate_unit="it/s", loss=0.123)),
    ("Epoch 1: 100%|██████████| 1000/1000 [01:40<00:00, 9.98it/s, loss=0.456, v_num=0]", dict(fmt="lightning", step=1000, loss=0.456)),
    ("Epoch 0:  12%|█▏        | 120/1000 [00:12<01:28, 9.95it/s, v_num=3, train_loss_step=2.100]", dict(fmt="lightning", loss=2.1)),
    ("Epoch 2:   5%|▌         | 50/1000 [01:40<31:40, 2.00s/it, v_num=7]", dict(fmt="lightning", step=50, rate=0.5, loss=None)),
    ("Epoch 0:  10%|█         | 10/100 [00:01<00:09, 9.50it/s, v_num=0]\rEpoch 0:  11%|█         | 11/100 [00:01<00:09, 9.60it/s, v_num=0]",
     dict(fmt="lightning", step=11, rate=9.6)),
    ("Epoch 3/9  ━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━╸━━━━━━━━ 450/1000 0:00:30 • 0:00:37 14.80it/s v_num: 0 train_loss: 0.123",
     dict(fmt="lightning", step=450, total=1000, epoch=3.0, rate=14.8, loss=0.123)),
    ("Training:  15%|█▌        | 131/851 [00:10<00:55, 12.30it/s, loss=2.31, lr=3e-4]", dict(fmt="lightning", step=131, loss=2.31)),
    ("1|100|Loss: 2.345: 10%|█         | 100/1000 [01:00<09:00, 1.67it/s]", dict(fmt="lightning", step=100, loss=2.345)),  # torchtune
    ("Epoch 0: :   1%|          | 10/1000 [00:20<33:00, reduced_train_loss=10.80, global_step=9.000, consumed_samples=640.0]",
     dict(fmt="lightning", step=10, epoch=0.0, loss=10.8, rate=None)),  # NeMo 1.x
    ("train:  15%|█▌        | 150/1000 [01:00<05:40, 2.50it/s, loss=2.34]", dict(fmt="lightning", step=150, loss=2.34)),  # Levanter
    # a leave=False bar cleared with \r, then the step printed on the same physical line
    ("Loading: 100%|██████████| 4/4 [00:01<00:00, 3.9it/s]\r                    \rstep=1 loss=9.9 tok/s=100", dict(fmt="kv", step=1)),
]

NOT_STEPS = [
    # Results, not the loop's progress (the redesign reads them as an evaluation's end and the run's
    # end, bot/core/markers.py): issue 10 found HF's final metrics dict read as a step line.
    "{'eval_loss': 2.1, 'eval_runtime': 12.3, 'eval_samples_per_second': 45.6, 'eval_steps_per_second': 5.7, 'epoch': 1.0}",
    "{'train_runtime': 1234.5678, 'train_samples_per_second': 12.345, 'train_steps_per_second': 0.386, 'train_loss': 1.9876, 'epoch': 3.0}",
    " validation loss at iteration 1000 on validation set | lm loss value: 2.345678E+00 | lm loss PPL: 1.043E+01 | ",
    "",
    "  Target 0 on cuda:0...",
    "training done",
    "warmup steps: 100",
    "  Total optimization steps = 1,000",
    "[INFO|trainer.py:2128] 2024-01-01 12:00:00,000 >>   Num update steps per epoch = 100",
    "  Gradient Accumulation steps = 4",
    "max_steps=1000, save_steps=500, logging_steps=10",
    "***** Running training *****",
    "Resuming from step: 500",
    "Training steps: 1000, warmup steps: 100, lr: 3e-4",
    "Evaluating:  40%|████      | 100/250 [00:10<00:15, 10.00it/s, loss=2.1]",
    "Saving model checkpoint to /out/checkpoint-1000",
    "saving checkpoint at iteration    1000 to /ckpt/gpt",
    "  successfully saved checkpoint from iteration    1000 to /ckpt/gpt [ t 1/1, p 1/1 ]",
    "Loading weights:  15%|█▌        | 131/851 [00:00<00:03, 199.62it/s]",
    "Loading checkpoint shards: 100%|██████████| 4/4 [00:03<00:00,  1.10it/s]",
    " 45%|████▌     | 450/1000 [02:30<03:03,  3.00it/s]",
    "Validation DataLoader 0:  40%|████      | 100/250 [00:10<00:15, 10.00it/s, val_loss=0.5]",
    "Map: 1310 examples [00:01, 999.00 examples/s]",
    "Traceback (most recent call last):",
    '  File "/w/train.py", line 88, in train_step',
    "    loss = model(step=step, lr=lr)",
    "    out = train_step(step=10, loss=2.0, lr=1e-4)",
    "ValueError: step=5 loss=nan is not finite",
    "Setting `pad_token_id` to `eos_token_id`:2 for open-end generation.",
    "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 372.53 GiB.",
]
# Lines the remote grep should already drop (it is a pre-filter, so this only checks it is not lax).
NOT_PREFILTERED = [
    "Loading weights:  15%|█▌        | 131/851 [00:00<00:03, 199.62it/s]",
    "Saving model checkpoint to /out/checkpoint-1000",
    "warmup steps: 100",
    "  Total optimization steps = 1,000",
    "Traceback (most recent call last):",
    "***** Running training *****",
    "  Target 0 on cuda:0...",
]


@pytest.mark.parametrize(("line", "expected"), STEPS)
def test_parse_step(line: str, expected: dict) -> None:
    step = parse_step(line)
    assert step is not None
    matches(step, expected)


@pytest.mark.parametrize("line", NOT_STEPS)
def test_not_a_step(line: str) -> None:
    assert parse_step(line) is None


CUSTOM = [
    (r"^\[train\]", "[train] #7 loss 0.5 speed 33", dict(fmt="custom", loss=0.5, step=None)),
    # batch counts the loop's steps within an epoch (Lightning, mmcv): the grammar reads it as the counter
    (r"^\[train\]", "[train] ep=1 batch=20 avg=0.5", dict(fmt="custom", step=20, loss=None)),
    # `it 42` is a step key of the grammar now: the line reads on its own, the pattern is not needed
    (r"tok/s", "[rank1]: it 42 lr 0.1 900 tok/s", dict(step=42, rate=900.0, rate_unit="tok/s")),
    (r"^\[train\]", "[train] step=7 loss=0.5", dict(fmt="kv", step=7)),  # a known format wins
]


@pytest.mark.parametrize(("pattern", "line", "expected"), CUSTOM)
def test_custom_pattern(pattern: str, line: str, expected: dict) -> None:
    step = parse_step(line, re.compile(pattern))
    assert step is not None
    matches(step, expected)


def test_custom_pattern_not_matching() -> None:
    assert parse_step("[eval] ep=1", re.compile(r"^\[train\]")) is None


@pytest.mark.parametrize(("name", "count", "last"), [("train_ok.log", 30, 60), ("train_oom.log", 5, 10)])
def test_real_logs_steps(name: str, count: int, last: int) -> None:
    steps = [s for line in split(read_real(name)) if (s := parse_step(line))]
    assert len(steps) == count
    assert steps[-1].step == last and steps[-1].counter == "step" and steps[-1].rate_unit == "tok/s"


# --- the grep pre-filter

CUSTOM_ERE = r"^\[train\]|it \d+"
ERE_LINES = [line for line, _ in STEPS] + [line for _, line, _ in CUSTOM]


@pytest.mark.parametrize("line", ERE_LINES)
def test_ere_matches_every_step_line(line: str) -> None:
    assert re.search(step_grep_ere(CUSTOM_ERE), line)


@pytest.mark.parametrize("line", [line for line, _ in STEPS])
def test_ere_without_custom(line: str) -> None:
    assert re.search(step_grep_ere(), line)


@pytest.mark.parametrize("line", NOT_PREFILTERED)
def test_ere_is_not_lax(line: str) -> None:
    assert not re.search(step_grep_ere(), line)


def test_ere_is_posix() -> None:
    ere = step_grep_ere(r"step=\d+\s[\w.]+")
    assert "\\d" not in ere and "\\s" not in ere and "\\w" not in ere and "(?" not in ere
    assert "[0-9]" in ere and "[A-Za-z0-9_.]" in ere


@pytest.mark.skipif(shutil.which("grep") is None, reason="no grep")
@pytest.mark.parametrize("locale", ["C", "C.UTF-8"])
def test_ere_with_real_grep(tmp_path: Path, locale: str) -> None:
    lines = ERE_LINES + NOT_PREFILTERED
    path = tmp_path / "log"
    path.write_bytes("\n".join(lines).encode() + b"\n")
    out = subprocess.run(["grep", "-anE", "-e", step_grep_ere(CUSTOM_ERE), str(path)], capture_output=True,
                         env={"LC_ALL": locale, "PATH": "/usr/bin:/bin"}, check=False)
    assert out.returncode == 0, out.stderr
    hits = {int(row.split(b":", 1)[0]) - 1 for row in out.stdout.split(b"\n") if row}
    assert hits == set(range(len(ERE_LINES)))


# Lines built the way loggers build them: fields, each maybe coloured, joined by separators.
_KEYS = ["step", "Step", "iter", "iteration", "global_step", "loss", "train_loss", "Loss", "lm loss", "tok/s", "it/s",
         "samples/s", "tokens_per_sec", "tps", "lr", "epoch", "Epoch", "elapsed", "memory", "mfu", "grad_norm", "'loss'",
         '"step"', "time", "val_loss", "x", "steps", "num_updates", "Tokens/s/device", "samples/sec", "SamplesPerSec", "s/it",
         "wps", "tgs", "throughput", "reduced_train_loss", "1|100|Loss"]
_VALUES = ["12", "3.5", "1,000", "41.3k", "1e-4", "nan", "10/100", "[5]", "3.4s", "00:01:05", "-2", "?", ""]
_field = st.tuples(st.sampled_from(["", "", R, G]), st.sampled_from(_KEYS), st.sampled_from(["=", ": ", ":", " ", "  ", ""]),
                   st.sampled_from(_VALUES)).map("".join)
_line = st.tuples(st.lists(_field, max_size=6), st.sampled_from([" ", "  ", " | ", ", ", "\t"]),
                  st.sampled_from(["", "[rank3]: ", "{", "Epoch 3: 45%|██  | 450/1000 [00:30<00:37, 14.80it/s, ", "iter 7: "])
                  ).map(lambda t: t[2] + t[1].join(t[0]))


@settings(max_examples=400)
@given(_line)
def test_ere_is_a_superset_of_parse_step(line: str) -> None:
    if parse_step(line) is not None:
        assert re.search(step_grep_ere(), line)


# --- progress bars

BARS = [
    ("Loading weights:  15%|█▌        | 131/851 [00:00<00:03, 199.62it/s]",
     dict(desc="Loading weights", pct=15, n=131, total=851, rate="199.62it/s", elapsed="00:00", remaining="00:03", finished=False)),
    ("  15%|█▌        | 131/851 [00:00<00:03, 199.62it/s]", dict(desc="", pct=15, n=131, total=851)),
    ("Loading weights:   0%|          | 0/219 [00:00<?, ?it/s]", dict(pct=0, n=0, rate=None, remaining=None)),
    ("Loading checkpoint shards: 100%|██████████| 4/4 [00:03<00:00,  1.10it/s]",
     dict(desc="Loading checkpoint shards", pct=100, rate="1.10it/s", finished=True)),
    ("Downloading shards:  50%|█████     | 2/4 [00:30<00:30, 15.02s/it]", dict(n=2, total=4, rate="15.02s/it")),
    ("model-00001-of-00004.safetensors:  45%|████▌     | 2.24G/4.98G [00:10<00:12, 224MB/s]",
     dict(desc="model-00001-of-00004.safetensors", n=2_240_000_000, total=4_980_000_000, rate="224MB/s")),
    ("Tokenizing:  10%|#         | 1.2k/12.0k [00:01<00:09, 1.20kit/s]", dict(n=1200, total=12000, pct=10)),
    ("Download: 12.0M/1.00G [00:05<07:00, 2.4MB/s]", None),  # no bar, no pct: not tqdm's default layout
    ("Map: 1310 examples [00:01, 999.00 examples/s]", dict(desc="Map", pct=None, n=1310, total=None, rate="999.00 examples/s")),
    ("123it [00:01, 99.50it/s]", dict(desc="", n=123, total=None)),
    ("Generating train split: 0 examples [00:00, ? examples/s]", dict(n=0, rate=None)),
    ("Map:  45%|████▌     | 4500/10000 [00:01<00:01, 4012.55 examples/s]", dict(pct=45, n=4500, total=10000)),
    ("Epoch 3:  45%|████▌     | 450/1000 [00:30<00:37, 14.80it/s, train_loss=0.123]", dict(desc="Epoch 3", pct=45, rate="14.80it/s")),
    ("Validation: |          | 0/? [00:00<?, ?it/s]", dict(desc="Validation", pct=None, n=0, total=None)),
    ("Validation DataLoader 0:  40%|████      | 100/250 [00:10<00:15, 10.00it/s]", dict(desc="Validation DataLoader 0", pct=40)),
    ("[rank0]: Loading weights:  50%|█████     | 50/100 [00:01<00:01, 50.00it/s]", dict(desc="Loading weights", n=50)),
    ("\x1b[32mLoading:  50%|\x1b[34m█████     \x1b[32m| 5/10 [00:01<00:01,  5.00it/s]\x1b[0m   ", dict(desc="Loading", n=5)),
    ("Fetching 4 files: 100%|██████████| 4/4 [00:00<00:00, 12345.67it/s]", dict(desc="Fetching 4 files", finished=True)),
]
NOT_BARS = [
    "", "step=5 loss=2", "| a | b |", "100%", "[00:01<00:02, 3it/s]", "Saving model checkpoint to /out/checkpoint-1000",
    "{'loss': 1.0}", " iteration       10/    1000 | consumed samples: 640 | lm loss: 7.3E+00 |",
    "  successfully saved checkpoint from iteration    1000 to /ckpt [ t 1/1, p 1/1 ]", "[2024-01-01 12:00:00] step 5 [00:01]",
]


@pytest.mark.parametrize(("frame", "expected"), BARS)
def test_parse_bar(frame: str, expected: dict | None) -> None:
    bar = parse_bar(frame)
    if expected is None:
        assert bar is None
        return
    assert bar is not None
    matches(bar, expected)
    assert "\x1b" not in bar.frame and bar.frame == bar.frame.strip()


@pytest.mark.parametrize("frame", NOT_BARS)
def test_not_a_bar(frame: str) -> None:
    assert parse_bar(frame) is None


FRAMES = "\rA:   0%|          | 0/10 [00:00<?, ?it/s]\rA:  10%|█         | 1/10 [00:00<00:01, 9.00it/s]"
LAST_FRAMES = [
    (FRAMES, "A:  10%|█         | 1/10 [00:00<00:01, 9.00it/s]"),
    (FRAMES + "   \r", "A:  10%|█         | 1/10 [00:00<00:01, 9.00it/s]"),  # tqdm pads and rewinds
    (FRAMES + "\nstep=1 loss=2\n", "A:  10%|█         | 1/10 [00:00<00:01, 9.00it/s]"),
    ("  Target 1 on cuda:1...\n" + FRAMES.replace("A", "Loading weights"), "Loading weights:  10%|█         | 1/10 [00:00<00:01, 9.00it/s]"),
    ("no bar here\nnor here", None),
    ("", None),
]


@pytest.mark.parametrize(("chunk", "expected"), LAST_FRAMES)
def test_last_bar_frame(chunk: str, expected: str | None) -> None:
    assert last_bar_frame(chunk) == expected


@pytest.mark.parametrize("name", ["train_ok.log", "train_oom.log"])
def test_real_loading_bar(name: str) -> None:
    bar_line = read_real(name).split("\n")[1]
    assert bar_line.count("\r") >= 5
    bar = parse_bar(last_bar_frame(bar_line) or "")
    assert bar is not None and bar.desc == "Loading weights" and bar.n == bar.total == 219 and bar.finished
    partial = bar_line.rsplit("\r", 2)[0]  # as a probe sees it while the bar is still drawing
    assert parse_bar(last_bar_frame(partial) or "").pct < 100


# --- crashes

OOM_TB = """Traceback (most recent call last):
  File "/workspace/train_demo.py", line 71, in <module>
    train(sys.argv[2], sys.argv[3], int(sys.argv[4]))
  File "/workspace/train_demo.py", line 59, in train
    big = torch.empty(int(400e9), dtype=torch.uint8, device=dev)
          ^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^
torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 372.53 GiB. GPU 0 has a total capacity of 139.80 GiB"""

CHILD_FAILED = """W0110 12:10:00.000000 140 torch/distributed/elastic/multiprocessing/api.py:897] Sending process 1235 closing signal SIGTERM
E0110 12:10:01.000000 140 torch/distributed/elastic/multiprocessing/api.py:869] failed (exitcode: -9) local_rank: 3 (pid: 12345) of binary: /usr/bin/python3
Traceback (most recent call last):
  File "/usr/local/bin/torchrun", line 8, in <module>
    sys.exit(main())
  File "/usr/local/lib/python3.11/site-packages/torch/distributed/launcher/api.py", line 263, in launch_agent
    raise ChildFailedError(
torch.distributed.elastic.multiprocessing.errors.ChildFailedError: 
============================================================
train.py FAILED
------------------------------------------------------------
Failures:
[1]:
  time      : 2024-01-10_12:10:00
  host      : node1
  rank      : 1 (local_rank: 1)
  exitcode  : -15 (pid: 1235)
  error_file: <N/A>
  traceback : Signal 15 (SIGTERM) received by PID 1235
------------------------------------------------------------
Root Cause (first observed failure):
[0]:
  time      : 2024-01-10_12:10:00
  host      : node1
  rank      : 3 (local_rank: 3)
  exitcode  : -9 (pid: 12345)
  error_file: <N/A>
  traceback : Signal 9 (SIGKILL) received by PID 12345
============================================================"""

WATCHDOG = (
    "[rank{r}]:[E110 12:00:00.123456789 ProcessGroupNCCL.cpp:616] [Rank {r}] Watchdog caught collective operation timeout: "
    "WorkNCCL(SeqNum=12345, OpType=ALLREDUCE, NumelIn=1, NumelOut=1, Timeout(ms)=600000) ran for 600030 milliseconds before timing out."
)
WATCHDOG_AFTER = """[rank{r}]:[E110 12:00:00.2 ProcessGroupNCCL.cpp:1785] [PG ID 0 PG GUID 0(default_pg) Rank {r}] Exception (either an error or timeout) detected by watchdog at work: 12345, last enqueued NCCL work: 12346, last completed NCCL work: 12344.
[rank{r}]:[E110 12:00:00.3 ProcessGroupNCCL.cpp:630] [Rank {r}] Some NCCL operations have failed or timed out. Due to the asynchronous nature of CUDA kernels, subsequent GPU operations might run on corrupted/incomplete data.
[rank{r}]:[E110 12:00:00.4 ProcessGroupNCCL.cpp:1595] [PG ID 0 PG GUID 0(default_pg) Rank {r}] Process group watchdog thread terminated with exception: [Rank {r}] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=12345, OpType=ALLREDUCE, NumelIn=1, NumelOut=1, Timeout(ms)=600000) ran for 600030 milliseconds before timing out.
[rank{r}]:terminate called after throwing an instance of 'c10::DistBackendError'
[rank{r}]:  what():  [PG ID 0 PG GUID 0(default_pg) Rank {r}] Process group watchdog thread terminated with exception: [Rank {r}] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=12345, OpType=ALLREDUCE, NumelIn=1, NumelOut=1, Timeout(ms)=600000) ran for 600030 milliseconds before timing out.
[rank{r}]:Exception raised from checkTimeout at ../torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:618 (most recent call first):
[rank{r}]:frame #0: c10::Error::Error(c10::SourceLocation, std::string) + 0x96 (0x7f0 in /usr/lib/libc10.so)"""


def prefixed(text: str, prefix: str) -> str:
    return "\n".join(prefix + line for line in text.split("\n"))


CRASHES = [
    ("oom", "step=10 loss=1\n" + OOM_TB,
     [dict(kind="oom", exc_type="torch.OutOfMemoryError", rank=None, thread=None, line_index=1)]),
    ("oom with rank prefixes", prefixed(OOM_TB, "[rank2]: "), [dict(kind="oom", rank=2, line_index=0)]),
    ("oom with torchrun --tee prefixes", prefixed(OOM_TB, "[default1]:"), [dict(kind="oom", rank=1)]),
    ("ansi colours", f"{R}Traceback (most recent call last):{X}\n  File \"x.py\", line 1, in <module>\n{R}ValueError: bad{X}",
     [dict(kind="traceback", exc_type="ValueError", message="bad")]),
    ("two ranks interleaved", "\n".join(a + "\n" + b for a, b in zip(
        prefixed(OOM_TB, "[rank0]: ").split("\n"),
        prefixed(OOM_TB.replace("torch.OutOfMemoryError: CUDA out of memory", "torch.distributed.DistBackendError: NCCL error in: "
                                "ProcessGroupNCCL.cpp:1970, unhandled system error"), "[rank1]: ").split("\n"), strict=True)),
     [dict(kind="oom", rank=0, line_index=0), dict(kind="nccl_error", rank=1, exc_type="torch.distributed.DistBackendError", line_index=1)]),
    ("thread", "step=3 loss=2\nException in thread drafter-1:\nTraceback (most recent call last):\n"
               '  File "/usr/lib/python3.11/threading.py", line 1045, in _bootstrap_inner\n    self.run()\n'
               "RuntimeError: CUDA error: an illegal memory access was encountered\n"
               "CUDA kernel errors might be asynchronously reported at some other API call.\nstep=4 loss=2",
     [dict(kind="traceback", thread="drafter-1", exc_type="RuntimeError",
           message="CUDA error: an illegal memory access was encountered", line_index=1)]),
    ("thread with target name", "Exception in thread Thread-3 (worker):\nTraceback (most recent call last):\n  File \"q.py\", line 2\nqueue.Empty",
     [dict(kind="traceback", thread="Thread-3 (worker)", exc_type="queue.Empty", message="")]),
    ("chain keeps the last exception", "Traceback (most recent call last):\n  File \"a.py\", line 1\nKeyError: 'x'\n\n"
     "During handling of the above exception, another exception occurred:\n\nTraceback (most recent call last):\n  File \"a.py\", line 3\n"
     "ValueError: no x", [dict(kind="traceback", exc_type="ValueError", message="no x", line_index=0)]),
    ("direct cause", OOM_TB + "\n\nThe above exception was the direct cause of the following exception:\n\n"
     "Traceback (most recent call last):\n  File \"t.py\", line 9\nRuntimeError: step failed",
     [dict(kind="oom", exc_type="torch.OutOfMemoryError", line_index=0)]),  # the cause, not its wrapper
    ("keyboard interrupt", "Traceback (most recent call last):\n  File \"t.py\", line 9, in <module>\n    time.sleep(1)\nKeyboardInterrupt",
     [dict(kind="interrupted", exc_type="KeyboardInterrupt", message="")]),
    ("cut off before the exception line", "step=1\nTraceback (most recent call last):\n  File \"t.py\", line 9, in <module>",
     [dict(kind="traceback", exc_type=None, line_index=1)]),
    ("long message", "Traceback (most recent call last):\nRuntimeError: " + "x" * 500, [dict(kind="traceback")]),
    ("exception group", "  + Exception Group Traceback (most recent call last):\n  |   File \"g.py\", line 1, in <module>\n"
     "  | ExceptionGroup: many (2 sub-exceptions)\n  +-+---------------- 1 ----------------\n    | ValueError: 1",
     [dict(kind="traceback", exc_type="ExceptionGroup", message="many (2 sub-exceptions)")]),
    ("cuda error out of memory", "Traceback (most recent call last):\n  File \"t.py\", line 1\nRuntimeError: CUDA error: out of memory",
     [dict(kind="oom", exc_type="RuntimeError")]),
    # The signal is the cause, not the RuntimeError that carries it (issue 20, class 5).
    ("dataloader worker killed is its signal", "Traceback (most recent call last):\n  File \"d.py\", line 1\n"
     "RuntimeError: DataLoader worker (pid 4321) is killed by signal: Killed.",
     [dict(kind="killed", exc_type=None, message="DataLoader worker (pid 4321) killed by signal SIGKILL",
           signal_hint="SIGKILL (often the kernel's OOM killer)")]),
    ("ignored exceptions are not crashes", "Exception ignored in: <function _after_fork at 0x7f>\nTraceback (most recent call last):\n"
     "  File \"threading.py\", line 1\nTypeError: 'NoneType' object is not callable\nstep=5 loss=1", []),
    ("watchdog, one per rank", "\n".join([WATCHDOG.format(r=3), WATCHDOG_AFTER.format(r=3), WATCHDOG.format(r=5)]),
     [dict(kind="nccl_timeout", rank=3, exc_type=None, line_index=0,
           message="NCCL collective timeout: ALLREDUCE (SeqNum=12345) ran for 600030 ms, timeout 600000 ms"),
      dict(kind="nccl_timeout", rank=5, line_index=8)]),
    ("watchdog in a traceback", "Traceback (most recent call last):\n  File \"t.py\", line 1\ntorch.distributed.DistBackendError: "
     "[Rank 4] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=7, OpType=BROADCAST, Timeout(ms)=1800000) ran for 1800100 milliseconds",
     [dict(kind="nccl_timeout", exc_type="torch.distributed.DistBackendError", rank=4)]),
    ("c++ abort without a traceback", "terminate called after throwing an instance of 'c10::Error'\n"
     "  what():  CUDA error: an illegal memory access was encountered\nException raised from c10_cuda_check_implementation\n"
     "Aborted (core dumped)", [dict(kind="traceback", exc_type="c10::Error", message="CUDA error: an illegal memory access was encountered"),
                               dict(kind="fatal", message="Aborted (core dumped)", line_index=3)]),
    # The agent's own line and the report's Root Cause both name the failed rank.
    ("torchrun child failed", "[rank3]: step=9\n" + CHILD_FAILED,
     [dict(kind="child_failed", rank=3, exit_code=-9, line_index=2),
      dict(kind="child_failed", exc_type="ChildFailedError", rank=3, exit_code=-9,
           signal_hint="SIGKILL (often the kernel's OOM killer)", line_index=3)]),
    ("child failed after an nccl timeout", CHILD_FAILED.replace("-9 (pid", "-6 (pid"),
     [dict(kind="child_failed", exit_code=-9, line_index=1),
      dict(kind="child_failed", exit_code=-6, signal_hint="SIGABRT (e.g. after an NCCL timeout)")]),
    ("child failed without its traceback", "\n".join(CHILD_FAILED.split("\n")[7:]).replace("-9 (pid", "-11 (pid"),
     [dict(kind="child_failed", rank=3, exit_code=-11, signal_hint="SIGSEGV", line_index=0)]),
    ("child failed, no root cause section", CHILD_FAILED.split("Root Cause")[0].replace("-15 (pid", "1 (pid"),
     [dict(kind="child_failed", rank=3, exit_code=-9, line_index=1),
      dict(kind="child_failed", rank=1, exit_code=1, signal_hint=None)]),
    ("bare Killed", "step=10 loss=1\nKilled", [dict(kind="killed", signal_hint="SIGKILL (often the kernel's OOM killer)", line_index=1)]),
    ("bash job Killed", "bash: line 1:  1234 Killed                  python train.py > /workspace/train.log 2>&1", [dict(kind="killed")]),
    ("script job Killed", "./run.sh: line 5: 98765 Killed                  torchrun --nproc_per_node 8 train.py", [dict(kind="killed")]),
    ("slurm oom", "slurmstepd: error: Detected 1 oom_kill event in StepId=123.0. Some of the step tasks have been OOM Killed.",
     [dict(kind="killed")]),
    ("segfault", "Segmentation fault (core dumped)", [dict(kind="segfault", signal_hint="SIGSEGV")]),
    ("faulthandler segfault, once", "Fatal Python error: Segmentation fault\n\nThread 0x00007f (most recent call first):\n"
     '  File "t.py", line 3 in <module>\nSegmentation fault (core dumped)', [dict(kind="segfault", line_index=0)]),
    ("a traceback cut short by the OOM killer", "Traceback (most recent call last):\n  File \"t.py\", line 9, in <module>\nKilled",
     [dict(kind="traceback", exc_type=None, line_index=0), dict(kind="killed", line_index=2)]),
    ("bash job segfault", "bash: line 1:  4321 Segmentation fault      (core dumped) python train.py", [dict(kind="segfault")]),
    ("healthy", "step=1 loss=2\nLoading weights:  15%|█▌        | 131/851\nUserWarning: TypedStorage is deprecated\n"
     "Killed 3 stale workers\nloss=nan detected, skipping batch\nINFO: Traceback logging enabled", []),
]


@pytest.mark.parametrize(("text", "expected"), [pytest.param(t, e, id=n) for n, t, e in CRASHES])
def test_find_crashes(text: str, expected: list[dict]) -> None:
    crashes = find_crashes(split(text))
    assert len(crashes) == len(expected), crashes
    for crash, want in zip(crashes, expected, strict=True):
        matches(crash, want)
        assert len(crash.message) <= 200


def test_real_oom() -> None:
    lines = split(read_real("train_oom.log"))
    [crash] = find_crashes(lines)
    assert crash.kind == "oom" and crash.exc_type == "torch.OutOfMemoryError" and not crash.in_thread
    assert crash.message.startswith("CUDA out of memory. Tried to allocate 372.53 GiB.")
    assert lines[crash.line_index] == "Traceback (most recent call last):"
    assert find_crashes(split(read_real("train_ok.log"))) == []


def test_crash_type() -> None:
    assert all(isinstance(c, Crash) for c in find_crashes(split(CHILD_FAILED + "\n" + OOM_TB)))


# --- activities

MARKERS = [
    ("hf save", ["step=999 loss=1", "Saving model checkpoint to /out/checkpoint-1000", "Configuration saved in /out/checkpoint-1000/config.json",
                 "Model weights saved in /out/checkpoint-1000/model.safetensors"], [(Mark.SAVING, 1, 1000), (Mark.SAVED, 3, 1000)]),
    ("megatron save", [" iteration     1000/ 5000 | lm loss: 2.0E+00 |", "saving checkpoint at iteration    1000 to /ckpt/gpt"],
     [(Mark.SAVING, 1, 1000)]),
    ("megatron save done", ["saving checkpoint at iteration    1000 to /ckpt/gpt",
                            "  successfully saved checkpoint from iteration    1000 to /ckpt/gpt [ t 1/1, p 1/1 ]"], [(Mark.SAVING, 0, 1000), (Mark.SAVED, 1, 1000)]),
    ("torchtitan save", ["[rank0]:[titan] 2025-01-10 12:00:00,000 - root - INFO - Saving the checkpoint (or staging if async is enabled)."],
     [(Mark.SAVING, 0, None)]),
    ("torchtitan save done", ["[titan] Saving the checkpoint (or staging if async is enabled).",
                              "[titan] Finished saving the checkpoint (or staging if async is enabled)in 12.34 seconds."], [(Mark.SAVING, 0, None), (Mark.SAVED, 1, None)]),
    ("torchtitan final save", ["[titan] Saving a full checkpoint at last step, step 5000."], [(Mark.SAVING, 0, 5000)]),
    ("generic save", ["Saving checkpoint..."], [(Mark.SAVING, 0, None)]),
    ("checkpointer", ["[Checkpointer] Saving…"], [(Mark.SAVING, 0, None)]),
    ("deepspeed", ["[2024-01-10 12:00:00,000] [INFO] [torch_checkpoint_engine.py:21:save] [Torch] Checkpoint global_step1000 is about to be saved!"],
     [(Mark.SAVING, 0, 1000)]),
    ("lightning save", ["Epoch 0, global step 1000: 'val_loss' reached 0.50000 (best 0.50000), saving model to "
                        "'/ckpt/epoch=0-step=1000.ckpt' as top 1"], [(Mark.SAVING, 0, 1000)]),
    ("hf eval", ["{'loss': 2.0, 'epoch': 1.0}", "***** Running Evaluation *****", "  Num examples = 1000", "  Batch size = 8",
                 " 40%|████      | 100/250 [00:10<00:15, 10.00it/s]"], [(Mark.EVALUATING, 1, None)]),
    ("hf eval done", ["***** Running Evaluation *****", "{'eval_loss': 2.1, 'eval_runtime': 12.3, 'epoch': 1.0}"], [(Mark.EVALUATING, 0, None), (Mark.EVALUATED, 1, None)]),
    ("lightning validation bar", ["Epoch 0: 100%|██████████| 10/10 [00:01<00:00, 9.9it/s, v_num=0]",
                                  "\rValidation DataLoader 0:  30%|███       | 3/10 [00:00<00:00, 30.0it/s]"
                                  "\rValidation DataLoader 0:  40%|████      | 4/10 [00:00<00:00, 30.0it/s]"],
     [(Mark.EVALUATING, 1, None)]),
    ("evaluating bar", ["Evaluating:  40%|████      | 100/250 [00:10<00:15, 10.00it/s]"], [(Mark.EVALUATING, 0, None)]),
    ("running evaluation at step", ["[rank0]: Running evaluation at step 2000"], [(Mark.EVALUATING, 0, 2000)]),
    ("megatron eval", ["Evaluating iter 10/100"], [(Mark.EVALUATING, 0, None)]),
    ("megatron eval done", ["Evaluating iter 100/100", " validation loss at iteration 1000 | lm loss value: 2.3E+00 | lm loss PPL: 9.9E+00 |"], [(Mark.EVALUATING, 0, None), (Mark.EVALUATED, 1, 1000)]),
    ("dynamo", ["W0110 12:00:00.000000 140 torch/_dynamo/convert_frame.py:844] [0/8] torch._dynamo hit config.cache_size_limit (8)"],
     [(Mark.COMPILING, 0, None)]),
    ("compiling model", ["step=1 loss=2", "Compiling model with torch.compile..."], [(Mark.COMPILING, 1, None)]),
    ("torchtitan compile", ["[rank0]:[titan] 2025-01-10 - root - INFO - Compiling each TransformerBlock with torch.compile"], [(Mark.COMPILING, 0, None)]),
    ("autotune", ["AUTOTUNE mm(8192x4096, 4096x4096)"], [(Mark.COMPILING, 0, None)]),
    ("extension build", ["Building extension module fused_adam..."], [(Mark.COMPILING, 0, None)]),
    ("each in its order", ["Saving model checkpoint to /out/checkpoint-500", "***** Running Evaluation *****"], [(Mark.SAVING, 0, 500), (Mark.EVALUATING, 1, None)]),
    ("a save before steps", ["Saving model checkpoint to /out/checkpoint-500", "step=501 loss=1"],
     [(Mark.SAVING, 0, 500)]),
    ("activation checkpointing is no save", ["Gradient checkpointing enabled, saving memory", "Applied selective activation checkpointing"],
     []),
    ("a loading bar announces loading", ["step=1 loss=2", "step=2 loss=2", "Loading checkpoint shards: 100%|██████████| 4/4 [00:03<00:00,  1.10it/s]"], [(Mark.LOADING, 2, None)]),
    ("a traceback through dynamo", ["Traceback (most recent call last):", '  File "/usr/lib/torch/_dynamo/eval_frame.py", line 1, in f',
                                    "    torch._dynamo.reset()", "torch._dynamo.exc.Unsupported: call_function"], []),
]


@pytest.mark.parametrize(("lines", "expected"), [pytest.param(ls, e, id=n) for n, ls, e in MARKERS])
def test_find_markers(lines: list[str], expected: list[tuple[Mark, int, int | None]]) -> None:
    assert [(m.kind, m.index, m.step) for m in find_markers(lines)] == expected


def test_a_marker_keeps_its_line_as_shown() -> None:
    [m] = find_markers(["[rank0]:  saving checkpoint at iteration    1000 to /ckpt/gpt  "])
    assert m.text == "[rank0]:  saving checkpoint at iteration    1000 to /ckpt/gpt"


def test_a_real_log_announces_its_start_and_its_end() -> None:
    markers = find_markers(read_real("train_ok.log").split("\n"))
    assert {m.kind for m in markers[:-1]} <= {Mark.LOADING, Mark.TRAINING}, markers
    assert markers[-1].kind is Mark.ENDED and markers[-1].text == "training done"


# --- robustness

noisy = st.lists(st.sampled_from(list("step=loss:0123456789.,/|%[]<>?() \t\r\n\x1bitokEpchTrbackFl{}'\"█_-:") + [
    "Traceback (most recent call last):", "Exception in thread t:", "Root Cause", "rank : 3", "exitcode : -9",
    "During handling of the above exception", "Killed", "Watchdog caught collective operation timeout", "[rank1]:",
    "ChildFailedError:", "ValueError: x", "  File \"x\"", "Saving checkpoint-5", "Epoch 1: ", "it/s", "iteration "])).map("".join)


@given(st.one_of(st.text(), noisy))
def test_parsers_never_raise(text: str) -> None:
    parse_step(text)
    parse_step(text, re.compile("s"))
    parse_bar(text)
    last_bar_frame(text)
    lines = split(text)
    assert all(0 <= c.line_index < len(lines) for c in find_crashes(lines))
    assert all(0 <= m.index < len(lines) for m in find_markers(lines))


def test_imports_stay_pure() -> None:
    code = ("import sys; before = set(sys.modules); import bot.core.formats, bot.core.crashes, bot.core.markers, bot.core.evidence, bot.core.redact; "
            "print(' '.join(sorted({m.split('.')[0] for m in set(sys.modules) - before})))")
    loaded = set(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                                cwd=Path(__file__).resolve().parents[1]).stdout.split())
    assert not loaded & {"subprocess", "asyncio", "sqlite3"}
    assert loaded - set(sys.stdlib_module_names) <= {"bot"}


@pytest.mark.skipif(shutil.which("grep") is None, reason="needs grep")
@pytest.mark.parametrize("custom, line, other", [
    (r"batch \d+ done", "batch 12 done in 3s", "batch x done"),
    (r"\w+_loss=\S+", "my_loss=2.5", "= nothing"),
    (r"it\D+\d+", "iter: 7", "it7"),
])
def test_python_class_escapes_mean_the_same_to_grep(custom, line, other):
    ere = step_grep_ere(custom)
    assert "\\d" not in ere and "\\D" not in ere and "\\S" not in ere and "\\W" not in ere
    found = subprocess.run(["grep", "-aE", "--", f"({_to_ere_only(custom)})"], input=f"{line}\n{other}\n",
                           capture_output=True, text=True, env={"LC_ALL": "C"}).stdout.splitlines()
    assert found == [line]
    assert re.search(custom, line) and not re.search(custom, other)


def _to_ere_only(custom: str) -> str:
    return step_grep_ere(custom).split(")|(", 1)[1][:-1]
