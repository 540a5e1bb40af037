"""Round-3 lessons (tests/fixtures/round3), phases and NaN, table-driven over real lines: a save the loop
went on after is over, an announcement behind a logger's prefix is one, a save after the end summary is
what a live process does, the final model's save after the last checkpoint ends a run, a NaN in the loss's
stand-ins (perplexity, cross-entropy, an epoch's own loss line) is said, and a source line number is no
loss. Each line comes from a public log (its source beside it); whole logs are cases in round3/."""

from __future__ import annotations

import pytest

from bot.core.diagnose import diagnose
from bot.core.grammar import fields
from bot.core.markers import Mark, find_markers
from bot.core.verdict import Level, Phase
from tests.builders import evidence
from tests.test_diagnose import Run

NOBODY: tuple = ()

# tensorflow/models#3000 (TF Object Detection API, slim): the Supervisor saves between steps.
TF_OD = """INFO:tensorflow:global step 665: loss = 1.4688 (646.632 sec/step)
INFO:tensorflow:Saving checkpoint to path training/model.ckpt
INFO:tensorflow:global step 666: loss = 1.7181 (195.437 sec/step)
INFO:tensorflow:global step 667: loss = 2.0240 (2.869 sec/step)
INFO:tensorflow:global step 672: loss = 2.0841 (1.780 sec/step)
INFO:tensorflow:Recording summary at step 672.
INFO:tensorflow:Saving checkpoint to path training/model.ckpt
INFO:tensorflow:global step 673: loss = 1.3150 (248.055 sec/step)
INFO:tensorflow:global step 676: loss = 2.8910 (10.194 sec/step)
INFO:tensorflow:Saving checkpoint to path training/model.ckpt
"""
# marian-nmt/marian#376: saves and validation, then the loop's lines again (`Up.` the update, `Sen.` with commas).
MARIAN = """[2021-07-17 13:49:01] Ep. 1 : Up. 20000 : Sen. 1,212,903 : Cost 5.85167885 : Time 984.07s : 2382.72 words/s
[2021-07-17 13:49:01] Saving model weights and runtime parameters to model/model.npz.orig.npz
[2021-07-17 13:49:39] Saving Adam parameters to model/model.npz.optimizer.npz
[2021-07-17 13:50:36] [valid] Ep. 1 : Up. 20000 : cross-entropy : 130.97 : new best
[2021-07-17 14:06:01] Ep. 1 : Up. 22000 : Sen. 1,316,283 : Cost 5.25472784 : Time 1019.73s : 2097.49 words/s
[2021-07-17 14:19:04] Ep. 1 : Up. 24000 : Sen. 1,454,670 : Cost 4.57147598 : Time 783.38s : 2713.49 words/s
[2021-07-17 14:29:40] Ep. 1 : Up. 26000 : Sen. 1,650,105 : Cost 3.89087892 : Time 636.06s : 2924.37 words/s
"""
# open-mmlab/mmdetection#4097 (mmdet 2): a save, then the evaluation it is stuck in.
MMDET = """2020-11-11 00:07:42,660 - mmdet - INFO - Epoch [24][250/371]	lr: 1.000e-02, eta: 1:31:00, time: 1.828, data_time: 0.440, 
2020-11-11 06:21:29,255 - mmdet - INFO - Saving checkpoint at 24 epochs
2020-11-11 06:24:03,237 - mmdet - INFO - Evaluating panoptic...
"""
# huggingface/trl#475: the end summary, then the script's last save (the lines are numbered).
TRL = """2369 {'loss': 1.5248, 'learning_rate': 1.0115231510580348e-05, 'epoch': 0.49}
2370 {'loss': 1.5033, 'learning_rate': 1.0111041273831971e-05, 'epoch': 0.49}
2371 {'train_runtime': 2772.1724, 'train_samples_per_second': 55.105, 'train_steps_per_second': 1.722, 'train_loss': 1.5517177024130093, 'epoch': 0.49}
2372 Save last checkpoint of the model
"""
# hpcaitech/ColossalAI DreamBooth (round3 case misc-colossalai-dreambooth-final-save-step1000): rich's wrapped records.
COLOSSAL = """[04/12/24 17:15:52] INFO     colossalai - colossalai - INFO:                                          
                             /home/users/nus/e1216290/scratch/colossalai/ColossalAI/examples/images/dr
                             eambooth/train_dreambooth_colossalai.py:686 main                         
                    INFO     colossalai - colossalai - INFO: Saving model checkpoint to               
                             /home/users/nus/e1216290/scratch/colossalai/ColossalAI/examples/images/dr
                             eambooth/weight_output/checkpoint-1000                                   
[04/12/24 17:15:54] INFO     colossalai - colossalai - INFO:                                          
                             /home/users/nus/e1216290/scratch/colossalai/ColossalAI/examples/images/dr
                             eambooth/train_dreambooth_colossalai.py:692 main                         
                    INFO     colossalai - colossalai - INFO: Saving model checkpoint to               
                             /home/users/nus/e1216290/scratch/colossalai/ColossalAI/examples/images/dr
                             eambooth/weight_output on rank 0                                         
"""
# OpenNMT/OpenNMT-py#1072: perplexity and cross-entropy went nan.
OPENNMT = """[2018-11-26 15:02:57,162 INFO] Step 5600/50000; acc:  47.14; ppl:  9.83; xent: 2.29; lr: 0.00069; 1065/1591 tok/s;  20926 sec
[2018-11-26 15:06:01,481 INFO] Step 5650/50000; acc:   0.19; ppl:   nan; xent:  nan; lr: 0.00070; 1928/2310 tok/s;  21110 sec
[2018-11-26 15:09:00,598 INFO] Step 5700/50000; acc:   0.17; ppl:   nan; xent:  nan; lr: 0.00070; 1827/2180 tok/s;  21289 sec
[2018-11-26 15:12:08,893 INFO] Step 5750/50000; acc:   0.12; ppl:   nan; xent:  nan; lr: 0.00071; 1664/2365 tok/s;  21477 sec
"""
# MIC-DKFZ/nnUNet#1612 (nnU-Net v2): the epoch's loss on a line of its own, before the next epoch's line.
NNUNET = """2023-08-09 14:55:25.642011: Epoch 0 
2023-08-09 14:55:25.642085: Current learning rate: 0.01 
2023-08-09 15:17:51.409852: train_loss nan 
2023-08-09 15:17:51.440985: val_loss nan 
2023-08-09 15:17:51.441061: Pseudo dice [0.0, 0.0] 
2023-08-09 15:17:51.452639: Epoch time: 1345.72 s 
2023-08-09 15:18:00.922225: Epoch 1 
2023-08-09 15:18:00.922357: Current learning rate: 0.00999 
"""

ALIVE = ((692, 40, "python3 train.py"),)

VERDICTS = [
    # (source, log, age s, writers, phase, level, words the headline holds, words it must not hold)
    ("tf-od: a trailing save in a run that saves between steps is the loop's", TF_OD, 30, ALIVE,
     Phase.TRAINING, Level.OK, ("676",), ("saving",)),
    ("tf-od: ...and silence after it is the loop's silence", TF_OD, 900, ALIVE, Phase.SILENT, Level.CRIT, ("676",), ()),
    ("marian: saves followed by progress are over", MARIAN, 60, ALIVE, Phase.TRAINING, Level.OK, ("26000",), ("saving",)),
    ("marian: silent 15 min is a hang", MARIAN, 900, ALIVE, Phase.SILENT, Level.CRIT, ("26000",), ()),
    ("mmdet2: an evaluation announced after the save", MMDET, 60, ALIVE, Phase.EVALUATING, Level.NOTE, ("24",), ()),
    ("trl: a save after the end summary, the writer alive", TRL, 20, ALIVE, Phase.SAVING, Level.NOTE,
     ("train_loss 1.552",), ("2372", "2371")),
    ("trl: ...and gone", TRL, 600, NOBODY, Phase.FINISHED, Level.OK, ("train_loss 1.552",), ("2372",)),
    ("colossalai: the final model's save, alive", COLOSSAL, 30, ALIVE, Phase.SAVING, Level.NOTE, ("final model", "1000"),
     ("692", "loss")),
    ("colossalai: the final model's save, gone, no error", COLOSSAL, 600, NOBODY, Phase.FINISHED, Level.OK, ("1000",), ()),
    ("opennmt: ppl and xent nan", OPENNMT, 60, ALIVE, Phase.TRAINING, Level.WARN, ("NaN", "5650"), ()),
    ("opennmt: ...and still said when silent", OPENNMT, 900, ALIVE, Phase.SILENT, Level.CRIT, ("NaN",), ()),
    ("nnunet2: train_loss nan on the epoch's own line", NNUNET, 60, ALIVE, Phase.TRAINING, Level.WARN, ("NaN",), ()),
    ("nnunet2: ...and still said when silent", NNUNET, 900, ALIVE, Phase.SILENT, Level.CRIT, ("NaN",), ()),
]


@pytest.mark.parametrize(("log", "age", "writers", "phase", "level", "said", "unsaid"),
                         [pytest.param(*c[1:], id=c[0]) for c in VERDICTS])
def test_round3_phases_and_nan(log, age, writers, phase, level, said, unsaid):
    v = diagnose(evidence(log, age=age, writers=writers), Run())
    assert (v.phase, v.level) == (phase, level), v.headline
    for s in said:
        assert s in v.headline, v.headline
    for s in unsaid:
        assert s not in v.headline, v.headline


MARKERS = [
    # (source, line, kind)
    ("mmdet2: behind logging's stamp and name", "2020-11-11 06:24:03,237 - mmdet - INFO - Evaluating panoptic...",
     Mark.EVALUATING),
    ("trl#475: an imperative, after a line number", "2372 Save last checkpoint of the model", Mark.SAVING),
    ("colossalai: a rich record indented to its level's column",
     "                    INFO     colossalai - colossalai - INFO: Saving model checkpoint to               ", Mark.SAVING),
]


@pytest.mark.parametrize(("line", "kind"), [pytest.param(*c[1:], id=c[0]) for c in MARKERS])
def test_announcements_behind_prefixes(line, kind):
    assert [m.kind for m in find_markers([line])] == [kind]


def test_a_traceback_source_line_is_still_no_announcement():
    # A frame's source line that says `save_checkpoint(...)` announces nothing (indented, no level word).
    assert find_markers(["    self.save_model(output_dir)  # Saving model checkpoint to"]) == ()


def test_a_source_line_number_is_no_number_of_the_run():
    # rich's `%(pathname)s:%(lineno)d` column: `colossalai.py:692` is line 692, not a loss of 692.
    assert fields("eambooth/train_dreambooth_colossalai.py:692 main") == []
    assert [f.value for f in fields("trainer.py:4117 >> loss: 0.25")] == [0.25]


GLUED = [
    # (source, line, {key: value} the fields must hold)
    ("espnet/espnet#2675, ESPnet2 LM trainer: the word glued after the number names it",
     "[PC] 2020-11-11 16:30:24,312 (trainer:486) INFO: 2epoch:train:1-375batch: iter_time=0.001, forward_time=0.005, "
     "loss=2.313, backward_time=0.005", {"epoch": 2, "batch": 375, "loss": 2.313}),
    ("a plural after the number is no key: `1000steps` names nothing by itself", "warmup 1000steps, loss 0.5", {"loss": 0.5}),
]


@pytest.mark.parametrize(("line", "want"), [pytest.param(*c[1:], id=c[0]) for c in GLUED])
def test_a_number_named_by_the_word_glued_after_it(line, want):
    got = {f.key: f.value for f in fields(line)}
    assert {k: got.get(k) for k in want} == want
    assert "steps" not in got


def test_espnet_epoch_is_not_the_step():
    log = ("[PC] 2020-11-11 16:30:14,840 (trainer:486) INFO: 1epoch:train:7126-7500batch: iter_time=0.001, forward_time=0.005, "
           "loss=2.339, backward_time=0.005, optim_step_time=1.963e-04, lr_0=0.100, train_time=0.014\n"
           "[PC] 2020-11-11 16:30:18,969 (trainer:184) INFO: 2/20epoch started. Estimated time to finish: 33 minutes and 42.59 seconds\n"
           "[PC] 2020-11-11 16:30:24,312 (trainer:486) INFO: 2epoch:train:1-375batch: iter_time=0.001, forward_time=0.005, "
           "loss=2.313, backward_time=0.005, optim_step_time=2.000e-04, lr_0=0.100, train_time=0.014\n")
    v = diagnose(evidence(log, age=5), Run())
    assert v.phase is Phase.TRAINING and "375" in v.headline and "step 2 " not in v.headline, v.headline
