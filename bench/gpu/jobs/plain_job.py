"""Plain PyTorch training loops (no trainer framework), printing `step=N loss=X tok/s=Y`.

    python3 -u plain_job.py --mode dl      [--device cuda|cpu] > train.log 2>&1
    python3 -u plain_job.py --mode rotate  ...
    python3 -u plain_job.py --mode compile ...
    python3 -u plain_job.py --mode segv --faulthandler ...

dl:      a DataLoader with --workers worker processes feeds the loop; the driver SIGKILLs one
         worker mid-training, and the main process dies with PyTorch's own
         `DataLoader worker (pid N) is killed by signal: Killed.` traceback.
rotate:  the loop prints a line per step until the file --control/stop appears, then
         `training done` and exit 0. The driver rotates the log under it (mv + create), deletes
         it under it (rm + create), or kills it beside a TensorBoard (--tb DIR: the loop also
         writes TensorBoard scalars there, as SummaryWriter does, flushed every second).
compile: the model is wrapped in torch.compile (default mode, default logging: whatever
         dynamo/inductor print by themselves); the first step compiles. When --control/fault
         appears, an embedding lookup with an out-of-range token id runs (eager, outside the
         compiled graph): a device-side assert on CUDA (IndexError on CPU), exit 1.
json:    the rotate loop, printing one JSON object a step (`{"step": 12, "loss": 9.84, "tokens_per_sec": 31797,
         "elapsed": 4.4}`), as loggers that write JSON lines do; stops at --steps with `{"event": "done", …}`.
nested:  tqdm bars, an outer one over --epochs epochs and an inner one (leave=False) over --per-epoch batches with
         the loss as its postfix; at the end `training finished`.
segv:    the rotate loop; when --control/fault appears, a native call reads address 0 (as a broken
         extension would): SIGSEGV, and with --faulthandler Python's own `Fatal Python error:
         Segmentation fault` with every thread's stack.
dl-hang: the dl loop; while --control/fault exists, every DataLoader worker blocks in __getitem__ (a
         read from a dead network mount would): the main process waits in next(), alive, the GPU idle.
save:    the rotate loop; at --save-at it announces `saving checkpoint to …/ckpt-N.pt`, writes
         --save-gb GB with torch.save and fsync (a large optimizer state), says `checkpoint saved`, and goes on.
spawn:   torch.multiprocessing.spawn of --ranks processes, each running the rotate loop with a `[rank R]`
         prefix; rank 1 raises ValueError at --fail-step, and spawn raises ProcessRaisedException in the parent.
anomaly: the rotate loop under torch.autograd.set_detect_anomaly(True); at --fail-step the loss takes a sqrt of a
         negative number, and backward raises `Function 'SqrtBackward0' returned nan values in its 0th output`
         after anomaly mode's warning with the forward call's stack.
sigterm: the rotate loop with a SIGTERM handler, as preemptible jobs have: on SIGTERM it says so, saves a
         checkpoint at the current step and exits 0.

The driver learns the moments from $JOB_EVENTS (events.py) and steers with control files;
neither shows in the log.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from events import event  # noqa: E402

event("start")

import torch  # noqa: E402
from torch import nn  # noqa: E402
from torch.utils.data import DataLoader, Dataset  # noqa: E402

event("imported")


class RandomTokens(Dataset):
    def __init__(self, n: int, seq: int, vocab: int, sleep: float):
        self.n, self.seq, self.vocab, self.sleep = n, seq, vocab, sleep

    def __len__(self) -> int:
        return self.n

    hang_file: str | None = None

    def __getitem__(self, i: int) -> torch.Tensor:
        while self.hang_file and os.path.exists(self.hang_file):
            time.sleep(0.5)
        if self.sleep:
            time.sleep(self.sleep)
        g = torch.Generator().manual_seed(i)
        return torch.randint(0, self.vocab, (self.seq,), generator=g)


class LM(nn.Module):
    def __init__(self, vocab: int, dim: int, layers: int, heads: int):
        super().__init__()
        self.emb = nn.Embedding(vocab, dim)
        layer = nn.TransformerEncoderLayer(dim, heads, dim * 4, batch_first=True, norm_first=False)
        self.body = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.head = nn.Linear(dim, vocab)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.emb(ids[:, :-1])
        h = self.body(x, is_causal=False)
        logits = self.head(h)
        return nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), ids[:, 1:].reshape(-1))


def model_args(p: argparse.ArgumentParser, *, control: str, steps: int) -> None:
    """The device, the control folder, the run's length and the model's size, as every job script takes them."""
    p.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    p.add_argument("--control", default=control)
    p.add_argument("--steps", type=int, default=steps)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--seq", type=int, default=256)
    p.add_argument("--vocab", type=int, default=16384)
    p.add_argument("--dim", type=int, default=768)
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--heads", type=int, default=12)


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--mode", choices=["dl", "rotate", "compile", "segv", "json", "nested", "dl-hang", "save", "spawn", "anomaly", "sigterm"], required=True)
    model_args(p, control="", steps=100000)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--item-sleep", type=float, default=0.01)
    p.add_argument("--step-sleep", type=float, default=0.0, help="rotate: pause per step")
    p.add_argument("--log-every", type=int, default=1)
    p.add_argument("--epochs", type=int, default=3, help="nested: outer bar's epochs")
    p.add_argument("--per-epoch", type=int, default=60, help="nested: inner bar's batches")
    p.add_argument("--faulthandler", action="store_true", help="faulthandler.enable(), as many trainers do")
    p.add_argument("--tb", default="", help="rotate: also write TensorBoard scalars into this folder")
    p.add_argument("--save-at", type=int, default=30, help="save: the step of the large save")
    p.add_argument("--save-gb", type=float, default=24.0, help="save: how many GB it writes")
    p.add_argument("--fail-step", type=int, default=20, help="spawn, anomaly: the step that fails")
    p.add_argument("--ranks", type=int, default=2, help="spawn: processes")
    a = p.parse_args()
    if a.mode == "spawn":
        import torch.multiprocessing as mp

        print(f"spawning {a.ranks} processes", flush=True)
        mp.spawn(_spawned, args=(a,), nprocs=a.ranks, join=True)
        print("all ranks done", flush=True)
        return 0
    return _train(a)


def _spawned(rank: int, a) -> None:
    a.rank = rank
    _train(a)


def _train(a) -> int:
    rank = getattr(a, "rank", None)
    say = (lambda text: print(f"[rank {rank}] {text}", flush=True)) if rank is not None else (lambda text: print(text, flush=True))
    stopping = []
    if a.mode == "sigterm":
        import signal

        signal.signal(signal.SIGTERM, lambda signum, frame: stopping.append(signum))
    if a.mode == "anomaly":
        torch.autograd.set_detect_anomaly(True)

    if a.faulthandler:
        import faulthandler

        faulthandler.enable()
    torch.manual_seed(0)
    dev = torch.device(a.device)
    model = LM(a.vocab, a.dim, a.layers, a.heads).to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4)
    n = sum(q.numel() for q in model.parameters())
    say(f"model: {n / 1e6:.1f}M params on {dev}")
    stop_file = os.path.join(a.control, "stop") if a.control else None
    fault_file = os.path.join(a.control, "fault") if a.control else None
    step_fn = model
    if a.mode == "compile":
        print("compiling the model with torch.compile()", flush=True)
        step_fn = torch.compile(model)

    if a.mode in ("dl", "dl-hang"):
        ds = RandomTokens(a.steps * a.batch, a.seq, a.vocab, a.item_sleep)
        ds.hang_file = fault_file if a.mode == "dl-hang" else None
        loader = DataLoader(ds, batch_size=a.batch, num_workers=a.workers, pin_memory=a.device == "cuda")
        print(f"DataLoader: {len(loader)} batches, num_workers={a.workers}", flush=True)
        batches = iter(loader)
    else:
        gen = torch.Generator(device=dev).manual_seed(0)
        batches = None

    if a.mode == "nested":
        return _nested(a, model, opt, dev)
    tb = None
    if a.tb:
        from torch.utils.tensorboard import SummaryWriter

        tb = SummaryWriter(a.tb, flush_secs=1)
    tokens = a.batch * a.seq
    t_last = time.time()
    t0 = t_last
    done = 0
    for step in range(1, a.steps + 1):
        if stop_file and os.path.exists(stop_file):
            break
        if a.mode == "compile" and fault_file and os.path.exists(fault_file):
            event("fault", step=step)
            bad = torch.full((a.batch, 8), a.vocab + 7, dtype=torch.long, device=dev)
            x = nn.functional.embedding(bad, model.emb.weight)
            print(f"step={step} probe mean={x.float().mean().item():.4f}", flush=True)
        if a.mode == "segv" and fault_file and os.path.exists(fault_file):
            import ctypes

            event("fault", step=step)
            ctypes.string_at(0)
        if stopping:
            event("sigterm", step=step)
            path = os.path.join(a.control or ".", f"ckpt-{done}.pt")
            say(f"received SIGTERM: saving a checkpoint at step {done} and exiting")
            torch.save({"model": model.state_dict(), "step": done}, path)
            say(f"checkpoint saved to {path}; exiting")
            event("exit")
            return 0
        if a.mode == "save" and step == a.save_at:
            _big_save(a, model, done, say)
        if batches is not None:
            ids = next(batches).to(dev, non_blocking=True)
        else:
            ids = torch.randint(0, a.vocab, (a.batch, a.seq), device=dev, generator=gen)
        if step == 1 and a.mode == "compile":
            event("compile_begin")
        with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=a.device == "cuda"):
            loss = step_fn(ids)
        if a.mode == "anomaly" and step == a.fail_step:
            event("fault", step=step)
            loss = loss + torch.sqrt(loss.detach().new_tensor(-1.0, requires_grad=True))
        if a.mode == "spawn" and rank == 1 and step == a.fail_step:
            event("fault", step=step)
            raise ValueError(f"bad batch at step {step}: token ids out of range for the loss")
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        if step % a.log_every == 0:
            val = loss.item()
            now = time.time()
            rate = tokens * (step - done) / max(now - t_last, 1e-9)
            if step == 1 and a.mode == "compile":
                event("compile_end")
            if a.mode == "json":
                print(json.dumps({"step": step, "loss": round(val, 4), "tokens_per_sec": round(rate),
                                  "elapsed": round(now - t0, 1)}), flush=True)
            else:
                say(f"step={step} loss={val:.4f} tok/s={rate:.0f} elapsed={now - t0:.1f}s")
            if tb is not None:
                tb.add_scalar("loss", val, step)
            t_last, done = now, step
            if rank in (None, 0):
                event("step", step=step)
        if a.step_sleep:
            time.sleep(a.step_sleep)
    if a.mode == "json":
        print(json.dumps({"event": "done", "steps": done, "elapsed": round(time.time() - t0, 1)}), flush=True)
    else:
        say("training done")
    event("exit")
    return 0


def _big_save(a, model, step: int, say) -> None:
    """A save as large models make them: --save-gb of state, written and fsynced, announced before and after."""
    path = os.path.join(a.control or ".", f"ckpt-{step}.pt")
    say(f"saving checkpoint to {path}")
    event("save_begin", step=step)
    t = time.time()
    state = {"model": model.state_dict(), "optimizer_shard": torch.ones(int(a.save_gb * 2**30) // 4)}
    with open(path, "wb") as f:
        torch.save(state, f)
        f.flush()
        os.fsync(f.fileno())
    os.remove(path)  # the disk is small: the bytes were written, that is the point
    say(f"checkpoint saved ({a.save_gb:.0f} GB in {time.time() - t:.1f} s)")
    event("save_end", step=step)


def _nested(a, model, opt, dev) -> int:
    from tqdm import tqdm

    gen = torch.Generator(device=dev).manual_seed(0)
    step = 0
    for epoch in tqdm(range(a.epochs), desc="epochs"):
        inner = tqdm(range(a.per_epoch), desc=f"epoch {epoch}", leave=False)
        for _ in inner:
            ids = torch.randint(0, a.vocab, (a.batch, a.seq), device=dev, generator=gen)
            with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=a.device == "cuda"):
                loss = model(ids)
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            step += 1
            inner.set_postfix(loss=f"{loss.item():.4f}")
            event("step", step=step, epoch=epoch)
            if a.step_sleep:
                time.sleep(a.step_sleep)
    print("training finished", flush=True)
    event("exit")
    return 0


if __name__ == "__main__":
    sys.exit(main())
