"""What redaction costs on every answer: a 64 KiB window of ordinary training-log lines, cleaned and redacted.

Times `redact_secrets(printable(line))` line by line (what the renderers did per tail line) and, where
the module has it, `redact_lines` over the same lines as one text; on a mixed window (training,
NCCL, download, wandb, vLLM lines), the same with three secrets in it, and a window of nothing but
step lines (no candidate at all: the fast path).

    .venv/bin/python bench/redact.py [--kib 64] [--repeat 30]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bot.core import redact

ORDINARY = [
    "[rank0]:step={i} loss=2.{i:04d} grad_norm=1.21 lr=3.0e-04 tok/s=41{i:03d} tokens/s=41000 elapsed={i}.4s",
    "{{'loss': 2.31, 'grad_norm': 1.2, 'learning_rate': 5e-05, 'epoch': 0.{i}}}",
    " 45%|████▌     | {i}/1000 [01:02<01:15,  7.31it/s]",
    "[rank1]:[W1201 09:43:{i:02d}.123456 ProcessGroupNCCL.cpp:1234] Rank 1: NCCL INFO Channel 00/32 : 0 1 2 3",
    "generation config: max_new_tokens=512 temperature=0.7 top_p=0.95 pad_token=<pad> eos_token=</s>",
    "Downloading shards: model-0000{i}-of-00004.safetensors sha256=9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08",
    "HEAD is now at 3f1c2b9a8d7e6f5a4b3c2d1e0f9a8b7c6d5e4f3a Merge pull request #{i} from org/fix-eval",
    "wandb: Run data is saved locally in /workspace/wandb/run-20241201_094312-a1b2c3d4",
    "wandb: 🚀 View run at https://wandb.ai/team/proj/runs/a1b2c3d4e5 run_id=7d9f0c1e-2b3a-4c5d-8e9f-0a1b2c3d4e5f",
    "Saving model checkpoint to /workspace/out/checkpoint-{i}000/model.safetensors (tokenizer_config.json, special_tokens_map.json)",
    "INFO 12-01 09:43:{i:02d} [engine.py:310] Avg prompt throughput: 1234.5 tokens/s, Avg generation throughput: 98.7 tokens/s",
    "torch.distributed: world_size=8 rank=3 local_rank=3 master_addr=10.0.0.12 master_port=29500",
]
SECRETS = [
    "export HF_TOKEN=hf_" + "a1B2c3D4e5" * 4,
    "curl -H 'Authorization: Bearer eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.SflKxwRJSMeKKF2QT4fwpMeJf36POk6yJV_adQssw5c'",
    "key id AKIAIOSFODNN7EXAMPLE secret wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY",
]


STEPS = ["step={i} loss=2.{i:04d} tok/s=41{i:03d} elapsed={i}.4s"]


def window(kib: int, extra: list[str] = (), kinds: list[str] = ORDINARY) -> list[str]:
    lines, size, i = [], 0, 0
    while size < kib * 1024:
        line = kinds[i % len(kinds)].format(i=i % 97)
        lines.append(line)
        size += len(line.encode()) + 1
        i += 1
    for k, secret in enumerate(extra):
        lines[len(lines) * (k + 1) // (len(extra) + 1)] = secret
    return lines


def timed(fn, lines: list[str], repeat: int) -> float:
    """Median milliseconds of `fn(lines)` over `repeat` runs."""
    out = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn(lines)
        out.append((time.perf_counter() - start) * 1000)
    return statistics.median(out)


def per_line(lines: list[str]) -> list[str]:
    return [redact.redact_secrets(redact.printable(line)) for line in lines]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--kib", type=int, default=64)
    ap.add_argument("--repeat", type=int, default=30)
    args = ap.parse_args()
    plain, dirty, steps = window(args.kib), window(args.kib, SECRETS), window(args.kib, kinds=STEPS)
    ways = [("per line", per_line)]
    if hasattr(redact, "redact_lines"):
        ways.append(("redact_lines", lambda lines: redact.redact_lines([redact.printable(x) for x in lines])))
    print(f"{len(plain)} lines, {sum(len(x) + 1 for x in plain)} characters")
    print(f"{'how':<14} {'mixed ms':>9} {'3 secrets ms':>13} {'steps only ms':>14}")
    results = {}
    for name, fn in ways:
        results[name] = [timed(fn, lines, args.repeat) for lines in (plain, dirty, steps)]
        print(f"{name:<14} {results[name][0]:>9.2f} {results[name][1]:>13.2f} {results[name][2]:>14.2f}")
    print("RESULT " + " ".join(f"{n.replace(' ', '_')}_ms={a:.2f} {n.replace(' ', '_')}_secrets_ms={b:.2f} "
                              f"{n.replace(' ', '_')}_steps_ms={c:.2f}" for n, (a, b, c) in results.items()))


if __name__ == "__main__":
    main()
