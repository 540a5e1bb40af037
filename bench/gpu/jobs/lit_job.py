"""A Lightning `Trainer` job: a small random-initialised transformer LM on random tokens,
--epochs epochs with a validation loop each epoch (and Lightning's sanity check first).

    python3 -u lit_job.py --bar tqdm|rich [--device cuda|cpu] [sizes...] > train.log 2>&1

--bar tqdm: callbacks=[TQDMProgressBar()];  --bar rich: callbacks=[RichProgressBar()];
enable_progress_bar=True either way, so what reaches the file is what the bar writes when
stdout is not a terminal. Items sleep --item-sleep seconds each (predictable epoch length).
Timing events for the driver go to $JOB_EVENTS (events.py), never to the log.

--control DIR steers a long run (issue 20's busy rich-bar job): while DIR/stall exists the loop
sleeps after its batch (alive, GPU memory held, GPU idle); once DIR/stop appears it ends two
steps later through max_steps, so Lightning prints its own `Trainer.fit` stopped line.

--fail-val-epoch N: the validation step of epoch N raises at its 6th batch (a metric over an empty batch), as a
validation bug does: Lightning's traceback, exit 1.
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
from torch import nn  # noqa: E402
from torch.utils.data import DataLoader, Dataset  # noqa: E402
import lightning.pytorch as pl  # noqa: E402
from lightning.pytorch.callbacks import Callback, RichProgressBar, TQDMProgressBar  # noqa: E402

event("imported")


class RandomTokens(Dataset):
    def __init__(self, n: int, seq: int, vocab: int, seed: int, sleep: float):
        self.n, self.seq, self.vocab, self.seed, self.sleep = n, seq, vocab, seed, sleep

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> torch.Tensor:
        if self.sleep:
            time.sleep(self.sleep)
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + i)
        return torch.randint(0, self.vocab, (self.seq,), generator=g)


class TinyLM(pl.LightningModule):
    def __init__(self, vocab: int, dim: int, layers: int, heads: int, lr: float, fail_val_epoch: int = -1):
        super().__init__()
        self.save_hyperparameters()
        self.fail_val_epoch = fail_val_epoch
        self.emb = nn.Embedding(vocab, dim)
        layer = nn.TransformerEncoderLayer(dim, heads, dim * 4, batch_first=True, norm_first=True)
        self.body = nn.TransformerEncoder(layer, layers)
        self.head = nn.Linear(dim, vocab)
        self.lr = lr

    def _loss(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.emb(ids[:, :-1])
        mask = nn.Transformer.generate_square_subsequent_mask(x.shape[1], device=x.device)
        h = self.body(x, mask=mask, is_causal=True)
        logits = self.head(h)
        return nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), ids[:, 1:].reshape(-1))

    def training_step(self, batch, batch_idx):
        loss = self._loss(batch)
        self.log("train_loss", loss, prog_bar=True)
        return loss

    def validation_step(self, batch, batch_idx):
        if self.current_epoch == self.fail_val_epoch and batch_idx == 5 and not self.trainer.sanity_checking:
            event("fault", epoch=self.current_epoch)
            torch.stack([])  # the metric of an empty batch: RuntimeError, stack expects a non-empty TensorList
        loss = self._loss(batch)
        self.log("val_loss", loss, prog_bar=True)

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=self.lr)


class Control(Callback):
    """The driver's control files: stall (sleep between batches), stop (end through max_steps)."""

    def __init__(self, folder: str):
        self.folder, self.stopping = folder, False

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        stall = os.path.join(self.folder, "stall")
        if os.path.exists(stall):
            event("stall_begin", step=trainer.global_step)
            while os.path.exists(stall):
                time.sleep(0.1)
            event("stall_end", step=trainer.global_step)
        if not self.stopping and os.path.exists(os.path.join(self.folder, "stop")):
            self.stopping = True
            try:
                trainer.fit_loop.max_steps = trainer.global_step + 2
            except AttributeError:  # a Lightning without the setter: stop at once instead
                trainer.should_stop = True
            event("stop_asked", step=trainer.global_step, max_steps=trainer.global_step + 2)


class Events(Callback):
    def on_train_epoch_start(self, trainer, pl_module):
        event("epoch_begin", epoch=trainer.current_epoch)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        event("batch", epoch=trainer.current_epoch, batch=batch_idx + 1, step=trainer.global_step)

    def on_validation_start(self, trainer, pl_module):
        event("sanity_begin" if trainer.sanity_checking else "val_begin", epoch=trainer.current_epoch)

    def on_validation_end(self, trainer, pl_module):
        event("sanity_end" if trainer.sanity_checking else "val_end", epoch=trainer.current_epoch)

    def on_train_epoch_end(self, trainer, pl_module):
        event("epoch_end", epoch=trainer.current_epoch)

    def on_fit_end(self, trainer, pl_module):
        event("fit_end", epoch=trainer.current_epoch, step=trainer.global_step)


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--bar", choices=["tqdm", "rich"], default="tqdm")
    p.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--train-batches", type=int, default=50)
    p.add_argument("--val-batches", type=int, default=30)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--seq", type=int, default=128)
    p.add_argument("--vocab", type=int, default=8192)
    p.add_argument("--dim", type=int, default=512)
    p.add_argument("--layers", type=int, default=6)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--item-sleep", type=float, default=0.005)
    p.add_argument("--lr", type=float, default=3e-4)
    p.add_argument("--control", default="", help="folder of the driver's stall / stop files")
    p.add_argument("--fail-val-epoch", type=int, default=-1)
    a = p.parse_args()

    pl.seed_everything(0)
    train = DataLoader(RandomTokens(a.train_batches * a.batch, a.seq, a.vocab, 1, a.item_sleep),
                       batch_size=a.batch, shuffle=True)
    val = DataLoader(RandomTokens(a.val_batches * a.batch, a.seq, a.vocab, 2, a.item_sleep),
                     batch_size=a.batch)
    model = TinyLM(a.vocab, a.dim, a.layers, a.heads, a.lr, a.fail_val_epoch)
    bar = TQDMProgressBar() if a.bar == "tqdm" else RichProgressBar()
    trainer = pl.Trainer(
        accelerator="gpu" if a.device == "cuda" else "cpu",
        devices=1,
        max_epochs=a.epochs,
        precision="bf16-mixed" if a.device == "cuda" else "32-true",
        enable_progress_bar=True,
        callbacks=[bar, Events()] + ([Control(a.control)] if a.control else []),
        logger=False,
        enable_checkpointing=False,
        log_every_n_steps=10,
    )
    trainer.fit(model, train, val)
    event("exit")
    return 0


if __name__ == "__main__":
    sys.exit(main())
