"""An Accelerate loop that lets `find_executable_batch_size` pick its batch, for sequences too long for the GPU.

    python3 -m accelerate.commands.launch --num_processes 1 accel_job.py [--device cuda|cpu]

The model materialises its attention scores (seq x seq per head), so at --seq tokens even one sequence does
not fit: every batch size from --start-batch down to 1 raises torch.OutOfMemoryError, Accelerate halves it
each time, and at zero raises `RuntimeError: No executable batch size found, reached zero.`; `accelerate
launch` then reports its child's exit as a CalledProcessError.
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from events import event  # noqa: E402

import torch  # noqa: E402
from accelerate import Accelerator  # noqa: E402
from accelerate.utils import find_executable_batch_size  # noqa: E402

from dist_job import Attn  # noqa: E402


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    p.add_argument("--seq", type=int, default=131072)
    p.add_argument("--start-batch", type=int, default=64)
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--vocab", type=int, default=16384)
    p.add_argument("--dim", type=int, default=1024)
    p.add_argument("--heads", type=int, default=16)
    a = p.parse_args()

    accelerator = Accelerator(mixed_precision="bf16" if a.device == "cuda" else "no", cpu=a.device == "cpu")
    model = Attn(a.vocab, a.dim, a.heads)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4)
    model, opt = accelerator.prepare(model, opt)
    accelerator.print(f"model: {sum(q.numel() for q in model.parameters()) / 1e6:.1f}M params, seq {a.seq}")
    event("ready")

    @find_executable_batch_size(starting_batch_size=a.start_batch)
    def train(batch_size: int) -> None:
        accelerator.free_memory()
        accelerator.print(f"trying batch size {batch_size}")
        event("try", batch=batch_size)
        for step in range(1, a.steps + 1):
            ids = torch.randint(0, a.vocab, (batch_size, a.seq), device=accelerator.device)
            with accelerator.autocast():
                loss = model(ids)
            accelerator.backward(loss)
            opt.step()
            opt.zero_grad()
            accelerator.print(f"step {step}/{a.steps} loss {loss.item():.4f}")
            event("step", step=step)

    train()
    accelerator.print("done")
    return 0


if __name__ == "__main__":
    sys.exit(main())
