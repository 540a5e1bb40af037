"""A small but real training job for runbot's GPU proof (issue 3).

It behaves like the runs runbot watches: a random-initialised Llama-style model saved as
safetensors shards, loaded back with `AutoModelForCausalLM.from_pretrained` (which draws the
real transformers `Loading weights` tqdm bar), a "drafter" thread doing its own GPU work on the
second GPU, and a main loop training with AdamW and printing `step=N loss=X tok/s=Y elapsed=Zs`.
Run it as `python3 -u train_llama.py train ... > train.log 2>&1`, as a container run would.

    python3 train_llama.py make  --out DIR [--layers N|auto --hidden H ...]  # create + save a checkpoint
    python3 train_llama.py evict --model DIR                               # drop its pages from the cache
    python3 train_llama.py train --model DIR --mode ok|hang|spin|oom|thread [--steps N --fail-at K]

Modes (and what runbot should then say):
  ok      train, print `training done`, exit 0                         -> training, then finished
  hang    at the fault the main thread blocks forever and the drafter stops:
          alive, silent, GPU memory held, GPUs idle                    -> silent
  spin    at the fault the main thread keeps GPU 0 at 100 % with matmuls but prints
          nothing; the drafter stops (GPU 1 idle, memory held)         -> silent, GPU 0 busy (NCCL-like)
  oom     at the fault allocate an impossible tensor: a real torch.OutOfMemoryError, exit 1
          (on CPU the allocator's RuntimeError instead)                -> crashed
  thread  at the fault the drafter thread raises; the main loop goes on -> training, thread died

The fault strikes at step --fail-at (0 = never by step count) or, with --control DIR, at the
first step after the file DIR/fault appears; DIR/stop ends ok and thread runs cleanly
(`training done`, exit 0). The harness (run_phases.sh) uses the files, so each phase lasts
as long as it takes to probe it; nothing about them shows in the log.

`make` and `evict` print timings for the operator (`make: ...`); `train` prints only what a
real training script would (its load time included), so its log stays realistic.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import threading
import time


def _device(arg: str):
    import torch

    if arg == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    return arg


def _dtype(name: str):
    import torch

    return {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[name]


def _gb(n_bytes: float) -> str:
    return f"{n_bytes / 1e9:.2f} GB"


def say(msg: str) -> None:
    print(msg, flush=True)


# ----------------------------------------------------------------------------- page cache


def evict_file(path: str) -> int:
    """fsync, then drop the file's pages from the page cache. Returns its size."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        return os.fstat(fd).st_size
    finally:
        os.close(fd)


def cached_fraction(paths: list[str]) -> str:
    """How much of these files sits in the page cache (mincore), or '?' if unknown."""
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.mmap.restype = ctypes.c_void_p
        libc.mmap.argtypes = [
            ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long,
        ]
        libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
        libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
        page = os.sysconf("SC_PAGE_SIZE")
        resident = pages = 0
        for path in paths:
            size = os.path.getsize(path)
            if size == 0:
                continue
            fd = os.open(path, os.O_RDONLY)
            try:
                addr = libc.mmap(None, size, 1, 1, fd, 0)  # PROT_READ, MAP_SHARED
                if addr in (None, ctypes.c_void_p(-1).value):
                    return "?"
                try:
                    n = (size + page - 1) // page
                    vec = (ctypes.c_ubyte * n)()
                    if libc.mincore(addr, size, vec) != 0:
                        return "?"
                    resident += sum(v & 1 for v in bytes(vec))
                    pages += n
                finally:
                    libc.munmap(addr, size)
            finally:
                os.close(fd)
        return f"{100.0 * resident / pages:.0f}%" if pages else "?"
    except Exception as exc:  # best effort only
        return f"? ({type(exc).__name__}: {exc})"


def _shards(directory: str) -> list[str]:
    return sorted(
        os.path.join(directory, f) for f in os.listdir(directory) if f.endswith(".safetensors")
    )


# ----------------------------------------------------------------------------- make


def calibrate(directory: str, dev: str, cfg_kwargs: dict, save_dtype: str, load_dtype: str, layers: int) -> dict:
    """Time the real loader on a small checkpoint of the same shape (fewer layers).

    Saves it, evicts it, then times `from_pretrained` cold and warm exactly as `train` calls it
    (HF_DEACTIVATE_ASYNC_LOAD in the environment applies). Rates are bytes on disk per second.
    """
    import torch
    from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM
    from transformers.utils import logging as hf_logging

    path = os.path.join(directory, "_calibrate")
    cfg = LlamaConfig(**{**cfg_kwargs, "num_hidden_layers": layers})
    prev = torch.get_default_dtype()
    torch.set_default_dtype(_dtype(save_dtype))
    with torch.device(dev):
        model = LlamaForCausalLM(cfg)
    torch.set_default_dtype(prev)
    t = time.time()
    model.save_pretrained(path, max_shard_size="2GB")
    del model
    shards = _shards(path)
    nbytes = sum(os.path.getsize(f) for f in shards)
    for f in os.listdir(path):
        evict_file(os.path.join(path, f))
    write_s = time.time() - t
    res = {"bytes": nbytes, "layers": layers, "write_Bps": nbytes / max(write_s, 1e-9),
           "cached_after_evict": cached_fraction(shards)}
    target = "cuda:0" if dev == "cuda" else "cpu"
    hf_logging.disable_progress_bar()
    try:
        for label in ("cold", "warm"):
            t = time.time()
            m = AutoModelForCausalLM.from_pretrained(path, dtype=_dtype(load_dtype), device_map={"": target})
            if dev == "cuda":
                torch.cuda.synchronize()
            res[f"{label}_s"] = time.time() - t
            res[f"{label}_Bps"] = nbytes / max(res[f"{label}_s"], 1e-9)
            del m
    finally:
        hf_logging.enable_progress_bar()
    if dev == "cuda":
        torch.cuda.empty_cache()
    for f in os.listdir(path):
        os.remove(os.path.join(path, f))
    os.rmdir(path)
    return res


def cmd_make(a: argparse.Namespace) -> int:
    t0 = time.time()
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    t_import = time.time() - t0
    dev = _device(a.device)
    torch.manual_seed(a.seed)
    inter = a.intermediate or max(64, int(a.hidden * 8 / 3) // 64 * 64)
    kv = a.kv_heads or a.heads
    head_dim = a.hidden // a.heads
    elem = torch.empty(0, dtype=_dtype(a.save_dtype)).element_size()
    per_layer = 2 * a.hidden * a.hidden + 2 * a.hidden * kv * head_dim + 3 * a.hidden * inter + 2 * a.hidden
    fixed = 2 * a.vocab * a.hidden + a.hidden
    cfg_kwargs = dict(
        vocab_size=a.vocab,
        hidden_size=a.hidden,
        intermediate_size=inter,
        num_attention_heads=a.heads,
        num_key_value_heads=kv,
        max_position_embeddings=max(2048, a.max_pos),
        tie_word_embeddings=False,
    )

    calib = None
    if a.layers == "auto" or a.calibrate:
        calib = calibrate(a.out, dev, cfg_kwargs, a.save_dtype, a.load_dtype, a.calibrate_layers)
        say(
            "make: calibrate on {:.2f} GB ({} layers): write+evict {:.2f} GB/s, {} cached after evict; "
            "from_pretrained cold {:.1f} s = {:.2f} GB/s, warm {:.1f} s = {:.2f} GB/s".format(
                calib["bytes"] / 1e9, calib["layers"], calib["write_Bps"] / 1e9, calib["cached_after_evict"],
                calib["cold_s"], calib["cold_Bps"] / 1e9, calib["warm_s"], calib["warm_Bps"] / 1e9,
            )
        )
    if a.layers == "auto":
        frac = str(calib["cached_after_evict"]).rstrip("%")
        evicted = frac.replace(".", "", 1).isdigit() and float(frac) <= 10
        rate = calib["cold_Bps"] if (evicted and a.expect_evict) else calib["warm_Bps"]
        want_bytes = a.target_load_s * rate
        layers = math.ceil((want_bytes / elem - fixed) / per_layer)
        cap = int((a.max_gb * 1e9 / elem - fixed) // per_layer)
        layers = max(a.min_layers, min(layers, cap))
        est = (layers * per_layer + fixed) * elem / rate
        say(
            f"make: auto size: {layers} layers (wanted ~{want_bytes / 1e9:.1f} GB for {a.target_load_s:.0f} s "
            f"at {rate / 1e9:.2f} GB/s {'cold' if evicted and a.expect_evict else 'warm'}, cap {a.max_gb:.0f} GB, "
            f"floor {a.min_layers}); estimated load {est:.0f} s"
        )
    else:
        layers = int(a.layers)

    cfg = LlamaConfig(**{**cfg_kwargs, "num_hidden_layers": layers})
    t1 = time.time()
    dtype = _dtype(a.save_dtype)
    # Build straight on the device in the dtype we save: init (normal_) runs on the GPU.
    prev = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    with torch.device(dev):
        model = LlamaForCausalLM(cfg)
    torch.set_default_dtype(prev)
    if dev == "cuda":
        torch.cuda.synchronize()
    n_params = sum(p.numel() for p in model.parameters())
    n_tensors = len(model.state_dict())
    n_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    t_create = time.time() - t1
    say(
        f"make: created {n_params / 1e9:.3f}B params, {n_tensors} tensors, {_gb(n_bytes)} "
        f"({a.save_dtype}, {layers} layers x hidden {a.hidden}) on {dev} in {t_create:.1f} s "
        f"(imports {t_import:.1f} s)"
    )
    t2 = time.time()
    model.save_pretrained(a.out, max_shard_size=a.max_shard_size)
    t_save = time.time() - t2
    del model
    shards = _shards(a.out)
    disk = sum(os.path.getsize(f) for f in shards)
    say(
        f"make: saved {_gb(disk)} in {len(shards)} shards to {a.out} in {t_save:.1f} s "
        f"({disk / 1e9 / max(t_save, 1e-9):.2f} GB/s, not yet synced)"
    )
    info = {
        "params": n_params, "tensors": n_tensors, "bytes_on_disk": disk, "shards": len(shards),
        "save_dtype": a.save_dtype, "layers": layers, "hidden": a.hidden, "intermediate": inter,
        "heads": a.heads, "kv_heads": kv, "vocab": a.vocab, "device": dev,
        "import_s": round(t_import, 2), "create_s": round(t_create, 2), "save_s": round(t_save, 2),
        "calibration": calib,
    }
    with open(os.path.join(a.out, "make_info.json"), "w") as f:
        json.dump(info, f, indent=1)
    say("make: " + json.dumps(info))
    return 0


# ----------------------------------------------------------------------------- evict


def cmd_evict(a: argparse.Namespace) -> int:
    """fsync and drop the checkpoint's pages from the page cache (no /proc/sys needed)."""
    files = [os.path.join(a.model, f) for f in sorted(os.listdir(a.model))]
    files = [f for f in files if os.path.isfile(f)]
    shards = _shards(a.model)
    before = cached_fraction(shards)
    t0 = time.time()
    total = sum(evict_file(f) for f in files)
    say(
        f"evict: fsync+fadvise(DONTNEED) on {len(files)} files, {_gb(total)} in {time.time() - t0:.1f} s; "
        f"shards cached before {before}, after {cached_fraction(shards)}"
    )
    return 0


# ----------------------------------------------------------------------------- train


class Drafter(threading.Thread):
    """Steady GPU work on its own device with its own weights, like a speculative drafter."""

    def __init__(self, idx: int, dev: str, progress: dict, a: argparse.Namespace):
        super().__init__(name=f"drafter-{idx}", daemon=True)
        self.idx = idx
        self.dev = dev
        self.progress = progress
        self.a = a
        self.stop = threading.Event()
        self.pause = threading.Event()
        self.fault = threading.Event()
        self.ready = threading.Event()

    def run(self) -> None:
        import torch

        a = self.a
        dtype = _dtype(a.dtype)
        dim = a.drafter_dim
        # Memory the drafter holds (its model and buffers), plus its working weights.
        hold = torch.zeros(max(1, int(a.drafter_gb * 1e9) // 2), dtype=dtype, device=self.dev)
        weights = [torch.randn(dim, dim, dtype=dtype, device=self.dev) / dim**0.5 for _ in range(4)]
        x = torch.randn(a.drafter_batch, dim, dtype=dtype, device=self.dev)
        self.ready.set()
        rounds = 0
        while not self.stop.is_set():
            if self.pause.is_set():
                self.stop.wait(1.0)
                continue
            if self.fault.is_set():
                self._fail(rounds)
            for w in weights:
                x = torch.tanh(x @ w)
            rounds += 1
            self.progress["drafted"] = rounds
            if self.dev.startswith("cuda"):
                torch.cuda.synchronize(self.dev)
            elif a.drafter_sleep:
                time.sleep(a.drafter_sleep)
        del hold, weights, x

    def _fail(self, rounds: int) -> None:
        raise RuntimeError(
            f"drafter {self.idx} on {self.dev}: hidden-state queue closed after {rounds} rounds "
            f"(target step {self.progress['step']}) [injected fault]"
        )


def cmd_train(a: argparse.Namespace) -> int:
    import torch
    from transformers import AutoModelForCausalLM

    torch.manual_seed(a.seed)
    dev = _device(a.device)
    n_gpu = torch.cuda.device_count() if dev == "cuda" else 0
    target = "cuda:0" if dev == "cuda" else "cpu"
    dtype = _dtype(a.dtype)

    say(f"  Target 0 on {target}...")
    t0 = time.time()
    model = AutoModelForCausalLM.from_pretrained(a.model, dtype=dtype, device_map={"": target})
    if dev == "cuda":
        torch.cuda.synchronize()
    n_params = sum(p.numel() for p in model.parameters())
    say(f"  Target 0 loaded: {n_params / 1e9:.2f}B params in {time.time() - t0:.1f}s")

    progress = {"step": 0}
    drafter = None
    if not a.no_drafter:
        ddev = "cuda:1" if n_gpu >= 2 else target
        say(f"  Drafter 1 on {ddev}...")
        drafter = Drafter(1, ddev, progress, a)
        drafter.start()
        drafter.ready.wait(300)

    model.train()
    if a.grad_ckpt:
        model.gradient_checkpointing_enable()
    # fused on the GPU: no optimizer-sized temporaries next to a big model
    fused = {"fused": True} if dev == "cuda" else {"foreach": True}
    opt = torch.optim.AdamW(model.parameters(), lr=a.lr, **fused)
    vocab = model.config.vocab_size
    gen = torch.Generator(device=target).manual_seed(a.seed)
    tokens_per_step = a.batch * a.seq
    fault_file = os.path.join(a.control, "fault") if a.control else None
    stop_file = os.path.join(a.control, "stop") if a.control else None
    faulted = False
    try:
        t_start = time.time()
        t_last = t_start
        last_logged = 0
        for step in range(1, a.steps + 1):
            if not faulted and (
                step == a.fail_at or (fault_file is not None and os.path.exists(fault_file))
            ):
                faulted = True
                _fault(a, target, drafter)
            if stop_file is not None and os.path.exists(stop_file):
                break
            ids = torch.randint(0, vocab, (a.batch, a.seq), device=target, generator=gen)
            out = model(input_ids=ids, labels=ids)
            out.loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            progress["step"] = step
            if step % a.log_every == 0 or step == a.steps:
                loss = out.loss.item()  # waits for the GPU
                now = time.time()
                rate = tokens_per_step * (step - last_logged) / max(now - t_last, 1e-9)
                say(f"step={step} loss={loss:.4f} tok/s={rate:.0f} elapsed={now - t_start:.1f}s")
                t_last, last_logged = now, step
            if a.sleep:
                time.sleep(a.sleep)
        say("training done")
    finally:
        if drafter is not None:
            drafter.stop.set()
            drafter.join(timeout=30)
    return 0


def _fault(a: argparse.Namespace, target: str, drafter: Drafter | None) -> None:
    import torch

    if a.mode == "oom":
        # Like a real run meeting a batch too large: ask for far more than the device has.
        big = torch.empty(int(a.oom_gb * 1e9), dtype=torch.uint8, device=target)
        big.fill_(1)
    elif a.mode == "thread":
        if drafter is not None:
            drafter.fault.set()
    elif a.mode in ("hang", "spin"):
        if drafter is not None:
            drafter.pause.set()
        if a.mode == "hang":
            _hang()
        _spin(target, a)


def _hang() -> None:
    """Alive, silent, memory held, GPUs idle (a deadlock, or a peer that never answers)."""
    lock = threading.Lock()
    lock.acquire()
    while True:
        lock.acquire(timeout=3600)


def _spin(target: str, a: argparse.Namespace) -> None:
    """Alive, silent, GPU busy: like a rank spinning inside a collective, waiting for a peer."""
    import torch

    n = 8192 if target.startswith("cuda") else 256
    x = torch.randn(n, n, dtype=_dtype(a.dtype), device=target)
    w = torch.randn(n, n, dtype=_dtype(a.dtype), device=target) / n**0.5
    while True:
        for _ in range(20):
            x = torch.tanh(x @ w)
        if target.startswith("cuda"):
            torch.cuda.synchronize(target)
        else:
            time.sleep(0.01)


# ----------------------------------------------------------------------------- cli


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)

    m = sub.add_parser("make", help="create and save a random-initialised Llama checkpoint")
    m.add_argument("--out", required=True)
    m.add_argument("--layers", default="4", help="a number, or 'auto': size for --target-load-s")
    m.add_argument("--hidden", type=int, default=256)
    m.add_argument("--intermediate", type=int, default=0, help="default: ~8/3 hidden, a multiple of 64")
    m.add_argument("--heads", type=int, default=8)
    m.add_argument("--kv-heads", type=int, default=0, help="default: = heads")
    m.add_argument("--vocab", type=int, default=32000)
    m.add_argument("--max-pos", type=int, default=2048)
    m.add_argument("--save-dtype", choices=["fp32", "bf16", "fp16"], default="bf16")
    m.add_argument("--load-dtype", choices=["fp32", "bf16", "fp16"], default="bf16",
                   help="the dtype train loads with (for calibration)")
    m.add_argument("--max-shard-size", default="2GB")
    m.add_argument("--device", default="auto", help="auto|cuda|cpu")
    m.add_argument("--seed", type=int, default=0)
    m.add_argument("--calibrate", action="store_true", help="time a test file even with fixed --layers")
    m.add_argument("--calibrate-layers", type=int, default=4, help="layers of the calibration checkpoint")
    m.add_argument("--target-load-s", type=float, default=25.0)
    m.add_argument("--expect-evict", type=int, default=1,
                   help="1: the checkpoint will be evicted before loading (use the cold rate)")
    m.add_argument("--max-gb", type=float, default=32.0, help="auto size: at most this much on disk")
    m.add_argument("--min-layers", type=int, default=8)

    e = sub.add_parser("evict", help="drop a checkpoint's files from the page cache")
    e.add_argument("--model", required=True)

    t = sub.add_parser("train", help="load the checkpoint and train")
    t.add_argument("--model", required=True)
    t.add_argument("--mode", choices=["ok", "hang", "spin", "oom", "thread"], default="ok")
    t.add_argument("--steps", type=int, default=30)
    t.add_argument("--fail-at", type=int, default=10, help="step at which the fault strikes (0: never)")
    t.add_argument("--control", default="", help="dir watched for the files 'fault' and 'stop'")
    t.add_argument("--batch", type=int, default=8)
    t.add_argument("--seq", type=int, default=1024)
    t.add_argument("--lr", type=float, default=1e-4)
    t.add_argument("--dtype", choices=["bf16", "fp16", "fp32"], default="bf16")
    t.add_argument("--log-every", type=int, default=2)
    t.add_argument("--sleep", type=float, default=0.2, help="pause per step (GPU util then oscillates)")
    t.add_argument("--grad-ckpt", action="store_true")
    t.add_argument("--oom-gb", type=float, default=400.0)
    t.add_argument("--no-drafter", action="store_true")
    t.add_argument("--drafter-gb", type=float, default=20.0, help="memory the drafter holds")
    t.add_argument("--drafter-dim", type=int, default=8192)
    t.add_argument("--drafter-batch", type=int, default=4096)
    t.add_argument("--drafter-sleep", type=float, default=0.05, help="CPU only: pause per round")
    t.add_argument("--device", default="auto", help="auto|cuda|cpu")
    t.add_argument("--seed", type=int, default=0)

    a = p.parse_args(argv)
    if a.cmd == "make":
        if a.layers != "auto":
            int(a.layers)
        return cmd_make(a)
    if a.cmd == "evict":
        return cmd_evict(a)
    return cmd_train(a)


if __name__ == "__main__":
    sys.exit(main())
