"""Training loops that recover, stall on purpose, or go wrong quietly: round 11's real GPU jobs.

    python3 -u recover_job.py --mode oom-retry  [--device cuda|cpu] > train.log 2>&1
    python3 -u recover_job.py --mode scale      ...
    python3 -u recover_job.py --mode resume [--resume] --control DIR ...   (the driver appends the relaunch)
    python3 -u recover_job.py --mode eval-long  ...

oom-retry: an automatic batch-size search as trainers do it by hand: try --batch-start, and on
           torch.OutOfMemoryError print the traceback (traceback.print_exc()) and `CUDA out of memory at
           batch_size=B; retrying with B/2`, pause --retry-pause s, and try again; then train with the one that fit
           (`[iter 00012] loss 9.7012 | 350 ms/iter | bs 512`).
scale:     fp16 autocast with GradScaler; every step's gradients overflow (the loss is multiplied by 1e30 before
           backward), so the scaler skips each step and halves its scale: the loss stays finite and nothing learns
           (`it 31 | loss 9.7012 | scale 3.052e-05 | 0.35 s/it`).
resume:    checkpoints every --ckpt-every steps (`saved checkpoint ckpt-20.pt`); the driver SIGKILLs it and relaunches
           it with --resume, appended to the same log: `resuming from DIR/ckpt-20.pt`, --load-secs of loading,
           `resumed at step 20`, then steps from 21.
eval-long: every --eval-every steps `Evaluating on the validation set (N batches)...`, --eval-secs of evaluation
           on the GPU that prints nothing, then `validation loss X | ppl Y`, and training goes on.

The driver learns the moments from $JOB_EVENTS (events.py) and steers with control files; neither shows in the log.
"""

from __future__ import annotations

import argparse
import glob
import math
import os
import sys
import time
import traceback

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from events import event  # noqa: E402

event("start")

import torch  # noqa: E402
from torch import nn  # noqa: E402

from plain_job import LM, model_args  # noqa: E402  (the same small model, the same arguments)

event("imported")


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--mode", choices=["oom-retry", "scale", "resume", "eval-long"], required=True)
    model_args(p, control=".", steps=1000)
    p.add_argument("--step-sleep", type=float, default=0.1)
    p.add_argument("--batch-start", type=int, default=8192, help="oom-retry: the first batch size tried")
    p.add_argument("--retry-pause", type=float, default=6.0, help="oom-retry: pause after each OOM")
    p.add_argument("--ckpt-every", type=int, default=10, help="resume: checkpoint period")
    p.add_argument("--resume", action="store_true", help="resume: start from the newest checkpoint in --control")
    p.add_argument("--load-secs", type=float, default=20.0, help="resume: the checkpoint's load time")
    p.add_argument("--eval-every", type=int, default=25, help="eval-long: evaluation period")
    p.add_argument("--eval-secs", type=float, default=45.0, help="eval-long: how long each evaluation runs")
    a = p.parse_args()
    torch.manual_seed(0)
    dev = torch.device(a.device)
    model = LM(a.vocab, a.dim, a.layers, a.heads).to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4)
    print(f"model: {sum(q.numel() for q in model.parameters()) / 1e6:.1f}M params on {dev}", flush=True)
    return {"oom-retry": oom_retry, "scale": scale, "resume": resume, "eval-long": eval_long}[a.mode](a, model, opt, dev)


def batch(a, dev: torch.device, size: int) -> torch.Tensor:
    return torch.randint(0, a.vocab, (size, a.seq), device=dev)


def train_step(a, model, opt, dev: torch.device, size: int) -> torch.Tensor:
    """One optimiser step on a random batch, in bf16 autocast on the GPU; the loss."""
    with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=dev.type == "cuda"):
        loss = model(batch(a, dev, size))
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    return loss


def oom_retry(a, model, opt, dev) -> int:
    size = a.batch_start
    while True:
        print(f"trying batch_size={size}", flush=True)
        try:
            with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=dev.type == "cuda"):
                loss = model(batch(a, dev, size))
            loss.backward()
            opt.zero_grad(set_to_none=True)
            break
        except torch.OutOfMemoryError:
            traceback.print_exc()
            opt.zero_grad(set_to_none=True)
            loss = None
            torch.cuda.empty_cache()
            print(f"CUDA out of memory at batch_size={size}; retrying with {size // 2}", flush=True)
            event("oom", size=size)
            size //= 2
            time.sleep(a.retry_pause)
    print(f"batch_size={size} fits; training", flush=True)
    t = time.time()
    for it in range(1, a.steps + 1):
        loss = train_step(a, model, opt, dev, size)
        now = time.time()
        print(f"[iter {it:05d}] loss {loss.item():.4f} | {1000 * (now - t):.0f} ms/iter | bs {size}", flush=True)
        t = now
        event("step", step=it)
        time.sleep(a.step_sleep)
    return 0


def scale(a, model, opt, dev) -> int:
    scaler = torch.amp.GradScaler(dev.type, enabled=True)
    t = time.time()
    for it in range(1, a.steps + 1):
        with torch.autocast(dev.type, dtype=torch.float16, enabled=True):
            loss = model(batch(a, dev, a.batch))
        scaler.scale(loss * 1e30).backward()  # every gradient overflows: the step is skipped, the scale halves
        scaler.step(opt)
        scaler.update()
        opt.zero_grad(set_to_none=True)
        now = time.time()
        print(f"it {it} | loss {loss.item():.4f} | scale {scaler.get_scale():.4g} | {now - t:.2f} s/it", flush=True)
        t = now
        event("step", step=it)
        time.sleep(a.step_sleep)
    return 0


def resume(a, model, opt, dev) -> int:
    first = 1
    if a.resume:
        found = sorted(glob.glob(os.path.join(a.control, "ckpt-*.pt")), key=lambda p: int(p.rsplit("-", 1)[1][:-3]))
        path = found[-1]
        print(f"resuming from {path}", flush=True)
        event("load_begin")
        state = torch.load(path, map_location=dev)
        model.load_state_dict(state["model"])
        time.sleep(a.load_secs)  # a large state's read from a network disk
        first = state["step"] + 1
        print(f"resumed at step {state['step']}", flush=True)
        event("load_end", step=state["step"])
    t = time.time()
    for step in range(first, a.steps + 1):
        loss = train_step(a, model, opt, dev, a.batch)
        now = time.time()
        print(f"step {step}/{a.steps} | loss {loss.item():.4f} | {a.batch * a.seq / (now - t):.0f} tok/s", flush=True)
        t = now
        if step % a.ckpt_every == 0:
            path = os.path.join(a.control, f"ckpt-{step}.pt")
            torch.save({"model": model.state_dict(), "step": step}, path)
            print(f"saved checkpoint {os.path.basename(path)}", flush=True)
        event("step", step=step)
        time.sleep(a.step_sleep)
    return 0


def eval_long(a, model, opt, dev) -> int:
    t = time.time()
    for step in range(1, a.steps + 1):
        loss = train_step(a, model, opt, dev, a.batch)
        now = time.time()
        print(f"Epoch 1 | step {step}/{a.steps} | loss {loss.item():.4f} | lr 3.0e-04", flush=True)
        t = now
        event("step", step=step)
        if step % a.eval_every == 0:
            n = 500
            print(f"Evaluating on the validation set ({n} batches)...", flush=True)
            event("eval_begin", step=step)
            total, seen, until = 0.0, 0, time.time() + a.eval_secs
            with torch.no_grad():
                while time.time() < until:
                    with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=dev.type == "cuda"):
                        total += model(batch(a, dev, a.batch)).item()
                    seen += 1
            print(f"validation loss {total / seen:.4f} | ppl {math.exp(min(total / seen, 50)):.1f}", flush=True)
            event("eval_end", step=step)
        time.sleep(a.step_sleep)
    return 0


if __name__ == "__main__":
    sys.exit(main())
