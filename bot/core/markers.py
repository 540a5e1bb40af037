"""Pure: lines that announce what a run is doing between steps (saving, evaluating, compiling, loading,
preparing data) or that it ended normally, each with where it stands in the log."""

from __future__ import annotations

import enum
import itertools
import re
from collections.abc import Sequence
from dataclasses import dataclass

from bot.core.grammar import message, parse_int, split_rank_prefix, strip_host_prefix
from bot.core.redact import redact_secrets


class Mark(str, enum.Enum):
    SAVING = "saving"
    SAVED = "saved"
    EVALUATING = "evaluating"
    EVALUATED = "evaluated"
    COMPILING = "compiling"
    LOADING = "loading"
    PREPARING = "preparing"
    TRAINING = "training"  # "***** Running training *****": the loop is about to start
    RESTARTING = "restarting"  # a launcher restarts its workers after a failure (torch elastic's agent)
    ENDED = "ended"  # a normal end, in the trainer's or the launcher's own words


@dataclass(frozen=True)
class Marker:
    kind: Mark
    index: int  # line in the window
    text: str  # the line as shown
    step: int | None = None  # "saving checkpoint at iteration 1000": 1000


# Normal ends, in the trainer's or the launcher's own words: the one table of end words, with where each comes
# from. A launcher's word counts for its ranks: DeepSpeed's `Process N exits successfully` follows every rank's
# own exit. (An interrupt handler's summary is no end: crashes._INTERRUPTS reads those, and they win.)
END_WORDS = (
    (r"exits successfully|exits? with return code = 0\b", "DeepSpeed's launcher: `Process 29248 exits successfully.`"),
    (r"\[after training is done\]|exiting program (?:after|at)\b", "Megatron: its time-budget and iteration exits"),
    (r"`?Trainer\.fit`? stopped: `?(?:max_epochs|max_steps|max_time)", "PyTorch Lightning: `Trainer.fit` stopped: `max_epochs=4` reached."),
    (r"['\"]train_runtime['\"]\s*:|\*{3,} train metrics \*{3,}", "HF Trainer's final metrics (dict, or LlamaFactory's table)"),
    (r"\btraining (?:is )?(?:done|complete|completed|finished)\b|\bfinish(?:ed)? training\b|\bdone training\b",
     "HF Trainer's `Training completed.`, autotrain's `Finished training, saving model...`, ASGL's `Finish training: the best …`, many scripts"),
    (r"\btraining [A-Z][\w.-]{1,30} (?:done|completed|finished)\W*$", "PaddleVideo: `training Res18 finished` (the model's name between)"),
    (r"\b(?:treinamento|entrenamiento) (?:foi )?(?:conclu[ií]do|finalizado|completado|terminado)\b|训练(?:完成|结束)|"
     r"\btraining abgeschlossen\b|\bentra[iî]nement termin[ée]\b",
     "the same words in Portuguese, Spanish, Chinese, German, French: `Treinamento concluído com sucesso`, `训练完成`"),
    (r"\b(?:run|job|fit|fitting|experiment|pipeline|study|search)\b\W{0,5}(?:is |has )?(?:done|completed?|finished)\b",
     "the whole job's own end: Flower's `Run finished 5 rounds in 22.28s`, CatBoost scripts' `model.fit... done`"),
    (r"\b(?:finished|completed|done)\b[^.;]{0,20}?\b\d+ (?:rounds?|epochs?|iterations?|steps?|trials?|episodes?) in \d",
     "a count of the loop's units done in a time: `finished 5 rounds in 22.28s`, `completed 100 epochs in 3.2h`"),
    (r"^\W*total (?:execution|run(?:ning)?|elapsed|wall(?:[- ]clock)?|training) time\b",
     "a script's last summary line: `Total Execution Time: 415.10 seconds` (a per-step `total:` is no line start)"),
    (r"\btraining of experiment is done\b", "YOLOX: `Training of experiment is done and the best AP is …`"),
    (r"\bend (?:of )?training\b", "PyTorch examples' word_language_model, Transformer-XL: `| End of training | test loss …`"),
    (r"\btraining wall time\b|\btotal training time\b|\boverall training speed\b",
     "detectron2's `Total training time` / `Overall training speed`, llama ports' `training wall time`"),
    (r"\bepochs? completed in\b", "YOLOv5/v7/v8: `300 epochs completed in 2.874 hours.`"),
    (r"\boptimization (?:is )?(?:done|finished|complete(?:d)?)\b",
     "Caffe's solver: `Optimization Done.`; TF 1 tutorials' and their descendants' `Optimization Finished!`"),
    (r"\ball done\b|^done\.?$|\bsaving final (?:model|checkpoint)|\bfinal (?:[\w-]+ ){0,3}(?:model|checkpoint) (?:[\w-]+ ){0,2}saved\b",
     "custom scripts' last words (`Final model saved`, MLatom's `FINAL ML MODEL CREATED AND SAVED`)"),
    (r"\bexit status:?\s*0\b", "PBS: `Job execution was successful. Exit Status 0.`"),
    (r"^successfully completed\.$", "LSF's job report: `Successfully completed.` (its `Subject: Job N: <name> … Done`)"),
    (r"^process finished with exit code 0\b", "PyCharm's run console: `Process finished with exit code 0`"),
    (r"\bterminating training\b", "Keras TerminateOnNaN: `Batch 3: Invalid loss, terminating training`"),
    # Not its patience's countdown, which says how far from stopping it is: `EarlyStopping counter: 1 out of 10`.
    (r"\bearly stopping\b(?![ \t]*(?:counter|patience)\b)|\bstopping training\b",
     "Keras EarlyStopping: `Epoch 8: early stopping`; YOLOv5's `Stopping training early`"),
    (r"^stopping since \w+ has not improved\b", "skorch's EarlyStopping: `Stopping since valid_loss has not improved in the last 3 epochs.`"),
    (r"^number of trials: (?P<trials>\d+)/(?P=trials) \((?P=trials) terminated\)", "Ray Tune's status once every trial has ended: `Number of trials: 2/2 (2 TERMINATED)`"),
    (r"^best pipeline: ", "TPOT's result once its search ends: `Best pipeline: BernoulliNB(KNeighborsClassifier(…), …)`"),
    (r"""^\{['"](?:event|status)['"]:\s*['"](?:done|finished|completed?|train_end|training_end)['"]""",
     "a JSON-lines logger's end record: `{\"event\": \"done\", \"steps\": 150, …}`"),
)
_ENDS = re.compile("(?i)" + "|".join(f"(?:{pattern})" for pattern, _ in END_WORDS))
_TRAIN_RUNTIME = re.compile(r"""['"]train_runtime['"]\s*:\s*['"]?([\d.]+)""")
_TRAIN_LOSS = re.compile(r"""['"]train_loss['"]\s*:\s*['"]?([\d.]+(?:e-?\d+)?)""")
_DS_EXITS = re.compile(r"Process \d+ exits successfully")
_METRICS_TABLE = re.compile(r"\*{3,} train metrics \*{3,}")
_METRICS_ROW = re.compile(r"^[ \t]+(train_loss|train_runtime)[ \t]+=[ \t]+([\d.:eE+-]+)[ \t]*$")


def end_reason(marker: Marker, lines: Sequence[str]) -> str:
    """How a run ended, in its own words, short: "max_steps=400000 reached", "8 processes exited successfully"."""
    if _DS_EXITS.search(marker.text):
        n = sum(1 for x in lines if _DS_EXITS.search(x))
        exits = _DS_EXITS.search(marker.text)[0] if n == 1 else f"{n} processes exited successfully"
        # The launcher's exits say the processes ended; the trainer's final metrics before them say what they did
        # (printed once, often hundreds of lines up, with the model's repr between).
        metrics = next((x for x in reversed(lines[:marker.index]) if "train_runtime" in x and _TRAIN_RUNTIME.search(x)), None)
        return f"{_trained(metrics)}; {exits}" if metrics else exits
    text = message(marker.text)
    if _METRICS_TABLE.search(text):  # HF's table under `***** train metrics *****`: its rows say the run's figures
        rows = dict(m.groups() for x in lines[marker.index + 1:marker.index + 12] if (m := _METRICS_ROW.match(x)))
        said = [f"train_loss {float(rows['train_loss']):.4g}" if "train_loss" in rows else "",
                f"runtime {rows['train_runtime']}" if "train_runtime" in rows else ""]
        return ", ".join(x for x in said if x) or "train metrics"
    if _TRAIN_RUNTIME.search(text):  # HF Trainer's final metrics dict: say what it means
        return _trained(text)
    if m := _ENDS.search(text):
        start = _sentence_start(text, m.start())
        stop = re.search(r"[.;!?](?: |$)", text[m.end():])
        text = text[start:m.end() + stop.start()] if stop else text[start:]
    # Lightning's `Trainer.fit stopped: max_epochs=6000 reached.`: what was reached is the reason; "stopped" is
    # what runbot's headlines call a process gone with no end, and must not be said of one that ended.
    text = re.sub(r"^`?Trainer\.fit`? stopped:[ \t]*", "", redact_secrets(text).replace("`", ""))  # redacted before the cut
    return _unwrapped(text)[:80] + ("…" if len(text) > 80 else "")


def _trained(metrics: str) -> str:
    """HF Trainer's final metrics dict in words: "trained 1.8 h, train_loss 4.597"."""
    took = float(_TRAIN_RUNTIME.search(metrics)[1])
    loss = _TRAIN_LOSS.search(metrics)
    took_words = f"{took / 3600:.1f} h" if took >= 5400 else f"{took / 60:.0f} min" if took >= 90 else f"{took:.0f} s"
    return f"trained {took_words}" + (f", train_loss {float(loss[1]):.4g}" if loss else "")


def _unwrapped(text: str) -> str:
    """Without the stars and backticks around it, and a bracket only where it has no partner."""
    text = text.replace("`", "").strip(" *")
    if text.startswith("[") and "]" not in text:
        text = text[1:]
    if text.endswith("]") and "[" not in text:
        text = text[:-1]
    return text.strip()


def _sentence_start(text: str, before: int) -> int:
    """Where the sentence holding `before` begins: after a ". " or " - ", or where a message was glued
    to a bar with no space (Keras's `loss: 44.4110Batch 3: Invalid loss, terminating training`)."""
    starts = [0] + [m.end() for m in re.finditer(r"[.;!?] +| - |(?<=[\d\]a-z])(?=[A-Z][a-z])|(?<=\])(?=[`'\"A-Z])",
                                                 text) if m.end() <= before]
    return starts[-1]


def words(marker: Marker, limit: int = 70) -> str:
    """The announcement in its own words, without launcher and logger prefixes: "Loading checkpoint from x.pth"."""
    text = _unwrapped(redact_secrets(message(marker.text)))  # redacted before the cut
    return text[:limit] + ("…" if len(text) > limit else "")
_NOT_END = re.compile(r"(?i)\b(?:not|never|un)\b[^.,;]{0,20}\b(?:done|complete|completed|finished|successfully)\b"
                      r"|\bfailed\b|\berror\b|\bwill\b|\bafter training is done,|\bif\b|\bbefore\b")

_SAVE = re.compile(r"(?i)\bsaving\b[^.;]{0,60}?\b(?:checkpoints?|ckpts?|models?|weights|state(?:_dict)?|optimizer|adapters?|"
                   r"lora|pipeline|tokenizer)\b|checkpoint\w*\]?[ \t:-]*saving|\bis about to be saved|"
                   r"\bwriting (?:the )?checkpoint|\bsave (?:weights|checkpoint|model) to\b|^saving model\b|\bsaving checkpoint\b"
                   # TRL's and many scripts' imperative: `Save last checkpoint of the model`
                   r"|\bsave (?:the )?(?:last|final|best) (?:checkpoint|model)\b|^save (?:the )?(?:checkpoint|model)\b")
_SAVED = re.compile(r"(?i)successfully saved|finished saving|done saving|saving took|checkpoint saved|is ready now|"
                    r"\bsaved (?:the )?(?:checkpoint|model|state|weights|adapter)\b|\bmodel weights saved\b|"
                    r"\bsaved (?:checkpoint|model) to\b|\bsave(?:d)? .*? in [\d.]+ ?s\b"
                    r"|\bcheckpoint\b[^;]{0,40}?\bsaved to\b")  # torchtune: `Model checkpoint of size 4.66 GiB saved to …`
_EVAL = re.compile(r"(?i)\*+[ \t]*Running (?:Evaluation|Prediction)|\bRunning (?:eval(?:uation)?|validation|inference)\b"
                   r"|^(?:Evaluating|Validating)\b|\bStart inference on\b|\bstart(?:ing)? (?:evaluation|validation)\b"
                   r"|^(?:Evaluation|Validation|Testing|Test|Sanity Checking)(?:[ \t]+DataLoader[ \t]+\d+)?[ \t]*(?::|\.\.\.|…|$)"
                   r"|\bEvaluate in main process\b"
                   # sentence-transformers' evaluators: `Information Retrieval Evaluation on msmarco_dev_small dataset`,
                   # a loop's own `Epoch 3 evaluation <…Evaluator object…>`
                   r"|\b(?:evaluation|validation) on\b(?![^:]*:[ \t]*\d)|^epoch \d+ (?:evaluation|validation)\b")
_EVALUATED = re.compile(r"""(?i)^\{['"]eval_|\*+ eval metrics \*+|validation loss at iteration|\bvalid on '.*' subset \|"""
                        r"|\bInference done\b|\bevaluation (?:results|done|finished)\b|^Average forward time\b"
                        r"|\bTotal inference time\b|\bval(?:idation)?[_ ]loss\b|\bEvaluation Epoch\b")
_COMPILE = re.compile(r"(?i)torch\._dynamo|torch\._inductor|\bcompiling\b|\bautotun|building extension module|"
                      r"emitting ninja build file|\btorch\.compile\b"
                      # XLA (JAX, Haiku, TF) while it compiles: `Constant folding an instruction is taking > 1s`
                      r"|\bconstant[- ]folding\b")
_LOAD = re.compile(r"(?i)^loading (?:checkpoint|model|weights|pretrained|state)|\bLoading checkpoint from\b|"
                   # mmcv/MMEngine: `load checkpoint from local path: …/stripnet_t.pth`, `load model from: …`
                   r"\bload (?:checkpoint|model|weights|pretrained(?: model)?) from\b|"
                   r"\bloading (?:the )?(?:checkpoint|model|weights) (?:from|shards)\b|\bresuming from checkpoint\b|"
                   # a relaunch reading its checkpoint by path: `resuming from /ckpt/resume/ckpt-30.pt`
                   r"\bresum(?:e|ing)(?: training)? from \S*(?:\.(?:pt|pth|ckpt|bin|safetensors|pkl|h5)\b|checkpoint|ckpt)|"
                   r"\bdownloading\b.*\b(?:model|weights|checkpoint|shards?)\b"
                   # a model class by its name (ai-toolkit's `Loading UMT5EncoderModel`, diffusers' `Loading pipeline
                   # components`), or quantized as it loads (`- quantizing 40 transformer blocks`)
                   r"|^loading (?-i:[A-Z][A-Za-z0-9]*(?:Model|Encoder|Decoder|Pipeline|Transformer\w*|VAE|UNet\w*))\b|\bquantizing\b")
_PREPARE = re.compile(r"(?i)\bbuilding (?:GPT |train|the |\w+ )?(?:datasets?|indices|index|vocab)|> building\b|"
                      # pycocotools under every COCO trainer (`creating index...`), AllenNLP's `Creating a vocabulary`
                      r"\bcreating (?:a |the )?(?:index|vocab(?:ulary)?|dictionary)\b|"
                      r"\b(?:tokeniz|preprocess)ing\b|\bloading (?:the )?(?:dataset|data)\b|\bprepar(?:e|ing) (?:the )?data"
                      # Kaldi's egs: `get_egs.sh: Generating training examples on disk`
                      r"|\bgenerating (?:\w+ )?(?:examples|egs|samples|features|shards)\b")
# torch.distributed.elastic's agent: `[default] Worker group FAILED. 3/3 attempts left; will restart worker group`.
_RESTART = re.compile(r"(?i)\bwill restart worker group\b")
_TRAIN = re.compile(r"(?i)\*+[ \t]*Running training[ \t]*\*+|\bStarting training\b|\bstart(?:ing)? training\b|\bbegin training\b")
# Lines that mention these words without announcing anything: traceback frames, code, exceptions.
_INDENTED = re.compile(r"(?:[ \t]{4}|\t)[ \t]*\S")  # a traceback's source lines, code
# rich's logging handler indents a record that shares the previous one's time: `                    INFO     …`
_RICH_RECORD = re.compile(r"(?:[ \t]+|\[[\d/: .,-]+\][ \t]+)(?:INFO|WARNING|DEBUG|NOTICE)[ \t]+\S")
# …and wraps a long message onto lines indented to the message's column, with no level of their own.
_RICH_WRAPPED = re.compile(r"[ \t]{20,}(?!(?:INFO|WARNING|DEBUG|NOTICE|ERROR|CRITICAL)\b)\S")
_NOT_ANNOUNCEMENT = re.compile(r'^[ \t]*File "|^[A-Za-z_][\w.]*(?:Error|Exception|Unsupported|Failed)\b:'
                               r"|Warning\b|warnings\.warn|\bdeprecat", re.I)
# Where an announcement stands, most telling first: "epoch 0, global step 1000" is at step 1000.
_STEPS = tuple(re.compile(p, re.I) for p in (r"checkpoint[-_](\d+)", r"global[_ ]?step[ _=:]*(\d+)", r"iteration[ \t]+(\d+)",
                                               r"\bstep[ _=:-]*(\d+)", r"\biter_0*(\d+)", r"\bepoch[ _=:-]*(\d+)"))
# The announcements in the order they are tried: "Saved checkpoint" is saved before it is saving, a save
# names a checkpoint that loading would claim, an evaluation's results before the evaluation.
# Each with the words every line its pattern matches holds (lower case): a line without them is not tried — a
# substring test costs a hundredth of these case-insensitive alternations (tests/test_causes_and_ends.py holds the
# words to every line of the corpora each pattern matches).
_KINDS = ((Mark.RESTARTING, _RESTART, ("restart",)),
          (Mark.SAVED, _SAVED, ("sav", "ready now")),
          (Mark.SAVING, _SAVE, ("sav", "writing")),
          (Mark.EVALUATED, _EVALUATED, ("eval", "valid", "infer", "average forward", "val_loss", "val loss")),
          (Mark.EVALUATING, _EVAL, ("eval", "valid", "predict", "infer", "test", "sanity")),
          (Mark.TRAINING, _TRAIN, ("train",)),
          (Mark.COMPILING, _COMPILE, ("dynamo", "inductor", "compil", "autotun", "extension", "ninja", "constant")),
          (Mark.LOADING, _LOAD, ("load", "resum", "quantiz")),
          (Mark.PREPARING, _PREPARE, ("build", "creat", "tokeniz", "preprocess", "load", "prepar", "generat")))
# Every END_WORDS line holds one of these (its `Total … time` lines by their phrase: "time" alone is in most step lines).
END_GATE = ("exit", "train", "done", "complet", "finish", "stop", "sav", "execution time", "run time", "running time",
            "elapsed time", "wall time", "clock time", "best pipeline", "treinamento", "entrenamiento", "训练",
            "abgeschlossen", "entraîn", "entrain", "terminated)", "not improved")
# A line with none of any pattern's words holds no announcement and no end: find_markers skips it unread.
_WORDS = tuple(dict.fromkeys(END_GATE + tuple(w for _, _, words in _KINDS for w in words)))


def _kind(text: str) -> Mark | None:
    lowered = text.lower()
    if any(w in lowered for w in END_GATE) and _ENDS.search(text) and not _NOT_END.search(text):
        return Mark.ENDED
    return next((kind for kind, pattern, words in _KINDS if any(w in lowered for w in words) and pattern.search(text)), None)


_KEY_ONLY = re.compile(r"[A-Za-z_][\w.-]*:\Z")
_NESTED = re.compile(r"[ \t]+[A-Za-z_][\w.-]*:(?:[ \t]|\Z)|[ \t]*- \S")  # a key nested below, or a list's item (`  - voc_2007_test`)


def _section_key(line: str, following: Sequence[str]) -> bool:
    """A configuration's section, not an announcement: a bare `TEST:` with its keys nested below (a YAML dump,
    yacs' `Running with config:`)."""
    return bool(_KEY_ONLY.match(line)) and bool(following) and bool(_NESTED.match(following[0]))


def find_markers(lines: Sequence[str]) -> tuple[Marker, ...]:
    """Every announcement and normal end in the lines, in order."""
    text = "\n".join(lines).lower()
    if not any(w in text for w in _WORDS):
        return ()
    out = []
    for i, shown in enumerate(lines):
        lowered = shown.lower()
        if not any(w in lowered for w in _WORDS):
            continue  # a line with none of the words cannot hold an announcement: most lines, at a substring's cost
        own = strip_host_prefix(split_rank_prefix(shown)[1])
        line = own.strip()
        if (not line or (_INDENTED.match(own) and not _RICH_RECORD.match(own)) or _NOT_ANNOUNCEMENT.search(line)
                or len(line) > 1500):
            continue
        # The words as the line has them, or after the logger's stamp and prefix (`2020-11-11 06:24:03,237 -
        # mmdet - INFO - Evaluating panoptic...`): an announcement's words open its message, not the line.
        kind = _kind(line) or _kind(message(line))
        if kind is None or _section_key(line, lines[i + 1:i + 2]):
            continue
        where = line
        if _RICH_RECORD.match(own):  # the wrapped rest of the record says where: `…/weight_output/checkpoint-1000`
            rest = [x.strip() for x in itertools.takewhile(_RICH_WRAPPED.match, lines[i + 1:i + 4])]
            where = line + "".join(rest)
        step = next((parse_int(m[1]) for p in _STEPS if (m := p.search(where))), None)
        out.append(Marker(kind, i, shown.strip(), step))
    return tuple(out)
