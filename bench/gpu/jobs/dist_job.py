"""A DistributedDataParallel loop under torchrun, two ranks on one GPU, printing rank 0's `step=N loss=X`.

    python3 -m torch.distributed.run --nproc_per_node 2 dist_job.py --mode hang|oom|dup [--device cuda|cpu]

hang: gloo (both ranks may share a GPU); when --control/stall appears, rank 1 stops before its next
      step's gradient all-reduce, so rank 0 waits inside it: the log stands still, both processes live.
      The driver then SIGKILLs rank 1 and torchrun reports it.
oom:  gloo; at --oom-step rank 1 gets one long outlier batch (--oom-seq tokens) whose attention
      scores do not fit in the GPU: torch.OutOfMemoryError on rank 1, torchrun stops rank 0.
flaky: gloo, under `--max-restarts 1`: on the first attempt rank 1 reads past its data shards at --fail-step
      (IndexError); torchrun's agent restarts the worker group and the second attempt runs to --steps, exit 0.
dup:  NCCL with both ranks on cuda:0, the mistake of a script that never calls set_device(LOCAL_RANK):
      NCCL refuses the duplicate GPU at DDP's first broadcast.

The driver learns the moments from $JOB_EVENTS (events.py); nothing of it shows in the log.
"""

from __future__ import annotations

import argparse
import datetime
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from events import event  # noqa: E402

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from torch import nn  # noqa: E402
from torch.nn.parallel import DistributedDataParallel as DDP  # noqa: E402


class Attn(nn.Module):
    """One causal self-attention block written out by hand (scores materialised, as many research codes do)."""

    def __init__(self, vocab: int, dim: int, heads: int):
        super().__init__()
        self.heads = heads
        self.emb = nn.Embedding(vocab, dim)
        self.qkv = nn.Linear(dim, 3 * dim)
        self.out = nn.Linear(dim, dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))
        self.head = nn.Linear(dim, vocab)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.emb(ids[:, :-1])
        b, s, d = x.shape
        q, k, v = self.qkv(x).view(b, s, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        scores = (q @ k.transpose(-1, -2)) / (d // self.heads) ** 0.5
        mask = torch.ones(s, s, dtype=torch.bool, device=x.device).triu(1)
        att = scores.masked_fill(mask, float("-inf")).softmax(-1) @ v
        x = x + self.out(att.transpose(1, 2).reshape(b, s, d))
        x = x + self.mlp(x)
        logits = self.head(x)
        return nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), ids[:, 1:].reshape(-1))


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--mode", choices=["hang", "oom", "dup", "flaky"], required=True)
    p.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    p.add_argument("--control", default="")
    p.add_argument("--steps", type=int, default=100000)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--seq", type=int, default=512)
    p.add_argument("--vocab", type=int, default=16384)
    p.add_argument("--dim", type=int, default=1024)
    p.add_argument("--heads", type=int, default=16)
    p.add_argument("--step-sleep", type=float, default=0.1)
    p.add_argument("--oom-step", type=int, default=20)
    p.add_argument("--oom-seq", type=int, default=131072)
    p.add_argument("--fail-step", type=int, default=10)
    a = p.parse_args()

    rank = int(os.environ["RANK"])
    world = int(os.environ["WORLD_SIZE"])
    backend = "nccl" if a.mode == "dup" else "gloo"
    dist.init_process_group(backend, timeout=datetime.timedelta(minutes=30))
    dev = torch.device(a.device, 0) if a.device == "cuda" else torch.device("cpu")
    if rank == 0:
        print(f"initialized {backend} process group: world_size={world}", flush=True)
    torch.manual_seed(0)
    model = Attn(a.vocab, a.dim, a.heads).to(dev)
    ddp = DDP(model, device_ids=[0] if a.device == "cuda" else None)
    opt = torch.optim.AdamW(ddp.parameters(), lr=3e-4)
    if rank == 0:
        n = sum(q.numel() for q in model.parameters())
        print(f"model: {n / 1e6:.1f}M params, DDP over {world} ranks", flush=True)
    event("ready", rank=rank, pid=os.getpid())
    stall = os.path.join(a.control, "stall") if a.control else ""
    attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    shards = list(range(a.fail_step - 1)) if (a.mode == "flaky" and rank == 1 and attempt == 0) else None
    if rank == 0:
        print(f"attempt {attempt}: training for {a.steps} steps", flush=True)
    gen = torch.Generator(device=dev).manual_seed(rank)
    t0 = time.time()
    for step in range(1, a.steps + 1):
        if rank == 1 and stall and os.path.exists(stall):
            event("stall_begin", step=step)
            while True:  # a rank that stops answering: rank 0 waits in the next all-reduce
                time.sleep(1)
        if shards is not None:
            if step > len(shards):
                event("fault", step=step, rank=rank)
            _ = shards[step - 1]  # a data shard list one short: IndexError on the first attempt
        seq = a.oom_seq if (a.mode == "oom" and rank == 1 and step == a.oom_step) else a.seq
        if seq != a.seq:
            event("outlier", step=step, seq=seq)
        ids = torch.randint(0, a.vocab, (a.batch if seq == a.seq else 1, seq), device=dev, generator=gen)
        with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=a.device == "cuda"):
            loss = ddp(ids)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        if rank == 0:
            print(f"step={step} loss={loss.item():.4f} elapsed={time.time() - t0:.1f}s", flush=True)
            event("step", step=step)
        if a.step_sleep:
            time.sleep(a.step_sleep)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
