"""A Hugging Face `Trainer` job: random-initialised LlamaForCausalLM built from a config,
random-token torch Datasets, nothing downloaded.

    python3 -u hf_job.py --mode ok  --out DIR [--device cuda|cpu] [sizes...] > train.log 2>&1
    python3 -u hf_job.py --mode nan --out DIR ...

ok:  logging_steps, an evaluation every --eval-steps (eval bar), --save-steps checkpoints
     (model + optimizer state), trainer.save_model() at the end, exit 0.
nan: a learning rate so large the loss goes inf/NaN in the first steps; the loop keeps
     stepping (logging_nan_inf_filter=False, so the NaN reaches the logged loss), exit 0.
early: EarlyStoppingCallback(early_stopping_patience=1) on eval_loss with greater_is_better=True (the
     direction set the wrong way round, a common slip): the loss falls, so the second evaluation is "worse"
     and the Trainer stops there, far short of max_steps, with its metrics dict; exit 0.

Items sleep --item-sleep seconds each (a data-loading bound job: steps and the eval bar
take a predictable time on any device). The job's own prints are what a plain training
script would print; timing events for the driver go to $JOB_EVENTS (see events.py).
"""

from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from events import event  # noqa: E402

event("start")

import torch  # noqa: E402
from torch.utils.data import Dataset  # noqa: E402
from transformers import (  # noqa: E402
    LlamaConfig,
    LlamaForCausalLM,
    Trainer,
    EarlyStoppingCallback,
    TrainerCallback,
    TrainingArguments,
)

event("imported")


class RandomTokens(Dataset):
    def __init__(self, n: int, seq: int, vocab: int, seed: int, sleep: float):
        self.n, self.seq, self.vocab, self.sleep = n, seq, vocab, sleep
        self.seed = seed

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> dict:
        if self.sleep:
            time.sleep(self.sleep)
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + i)
        ids = torch.randint(0, self.vocab, (self.seq,), generator=g)
        return {"input_ids": ids, "labels": ids.clone()}


class Events(TrainerCallback):
    """Tells the driver what the Trainer is about to do (after DefaultFlowCallback decided)."""

    def on_train_begin(self, args, state, control, **kw):
        event("train_begin", max_steps=state.max_steps)

    def on_step_end(self, args, state, control, **kw):
        event("step", step=state.global_step, max_steps=state.max_steps)
        if control.should_evaluate:
            event("eval_begin", step=state.global_step)
        if control.should_save:
            event("save_begin", step=state.global_step)

    def on_evaluate(self, args, state, control, **kw):
        event("eval_end", step=state.global_step)

    def on_save(self, args, state, control, **kw):
        event("save_end", step=state.global_step)

    def on_train_end(self, args, state, control, **kw):
        event("train_end", step=state.global_step)


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--mode", choices=["ok", "nan", "early"], default="ok")
    p.add_argument("--out", required=True)
    p.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    p.add_argument("--layers", type=int, default=24)
    p.add_argument("--hidden", type=int, default=1024)
    p.add_argument("--heads", type=int, default=16)
    p.add_argument("--vocab", type=int, default=32000)
    p.add_argument("--seq", type=int, default=256)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--steps", type=int, default=120)
    p.add_argument("--logging-steps", type=int, default=10)
    p.add_argument("--eval-steps", type=int, default=40)
    p.add_argument("--save-steps", type=int, default=60)
    p.add_argument("--eval-items", type=int, default=320)
    p.add_argument("--item-sleep", type=float, default=0.012)
    p.add_argument("--lr", type=float, default=3e-4)
    a = p.parse_args()

    torch.manual_seed(0)
    cfg = LlamaConfig(
        vocab_size=a.vocab, hidden_size=a.hidden, intermediate_size=a.hidden * 11 // 4 // 64 * 64,
        num_hidden_layers=a.layers, num_attention_heads=a.heads, num_key_value_heads=a.heads,
        max_position_embeddings=max(2048, a.seq), tie_word_embeddings=False,
    )
    model = LlamaForCausalLM(cfg)
    n = sum(p.numel() for p in model.parameters())
    print(f"model: LlamaForCausalLM {n / 1e6:.1f}M params ({a.layers} layers, hidden {a.hidden})", flush=True)

    nan = a.mode == "nan"
    train_ds = RandomTokens(a.steps * a.batch, a.seq, a.vocab, 1, a.item_sleep)
    eval_ds = None if nan else RandomTokens(a.eval_items, a.seq, a.vocab, 2, a.item_sleep)
    args = TrainingArguments(
        output_dir=a.out,
        max_steps=a.steps,
        per_device_train_batch_size=a.batch,
        per_device_eval_batch_size=a.batch,
        learning_rate=a.lr,
        lr_scheduler_type="constant" if nan else "linear",
        warmup_steps=0 if nan else 10,
        max_grad_norm=0.0 if nan else 1.0,
        logging_steps=1 if nan else a.logging_steps,  # nan: the first, finite loss shows, then NaN
        logging_nan_inf_filter=not nan,
        eval_strategy="no" if nan else "steps",
        eval_steps=None if nan else a.eval_steps,
        save_strategy="no" if nan else "steps",
        save_steps=a.save_steps,
        save_total_limit=1,
        bf16=a.device == "cuda",
        use_cpu=a.device == "cpu",
        dataloader_num_workers=0,
        report_to="none",
        disable_tqdm=False,
        seed=0,
        **({"load_best_model_at_end": True, "metric_for_best_model": "eval_loss", "greater_is_better": True}
           if a.mode == "early" else {}),
    )
    early = [EarlyStoppingCallback(early_stopping_patience=1)] if a.mode == "early" else []
    trainer = Trainer(model=model, args=args, train_dataset=train_ds, eval_dataset=eval_ds,
                      callbacks=[Events(), *early])
    result = trainer.train()
    print(result, flush=True)
    if not nan:
        event("final_save_begin")
        trainer.save_model(os.path.join(a.out, "final"))
        event("final_save_end")
        print(f"saved final model to {os.path.join(a.out, 'final')}", flush=True)
    event("exit")
    return 0


if __name__ == "__main__":
    sys.exit(main())
