"""Pure: the grammar every log recogniser shares — numbers and the keys that name them, line templates,
line timestamps, rank prefixes, \\r-frames — and the remote grep pre-filter built from the same words."""

from __future__ import annotations

import functools
import re
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

# --- words that name things -----------------------------------------------------------------
# One definition: the recognisers read fields by these words, and the probe's grep pre-filter
# (prefilter_ere) is built from them, so the two cannot drift apart.

# "total_timesteps": stable-baselines3's logger table counts environment steps (before its `n_updates`).
STEP_KEYS = ("global_step", "global step", "step", "steps", "iteration", "iter", "iters", "it", "total_timesteps",
             "num_updates", "updates", "update", "s", "batch", "i", "trainer/global_step", "train/global_step",
             "up.",  # Marian: `Ep. 1 : Up. 26000 : Sen. 1,650,105 : Cost 3.89087892`
             # A loop's counter when no step is printed: RL's episodes (`Episode 502 Frame 11509`, kungfu's
             # `episode: 2061 end in 5169 steps`), boosting's and federated learning's rounds (Flower's
             # `[ROUND 4]`), a hyper-parameter search's trials (Optuna's `Trial 53 pruned.`).
             "episode", "round", "trial")
EPOCH_KEYS = ("epoch", "ep", "epochs", "ep.")
LOSS_WORDS = ("loss",)
LOSS_ALIASES = ("trl", "tl", "ppl")  # llm.c's train loss; "ppl" only when no loss is printed
RATE_UNITS = {  # unit as printed -> unit as shown
    "tok/s": "tok/s", "tokens/s": "tok/s", "token/s": "tok/s", "tok/sec": "tok/s", "tokens/sec": "tok/s",
    "it/s": "it/s", "s/it": "s/it", "step/s": "it/s", "steps/s": "it/s", "samples/s": "samples/s",
    "sample/s": "samples/s", "samples/sec": "samples/s", "ex/s": "samples/s", "examples/s": "samples/s",
    "img/s": "img/s", "images/s": "img/s", "seq/s": "samples/s", "seqs/s": "samples/s",
}
RATE_KEYS = {  # key (normalised) -> unit
    "tok/s": "tok/s", "tokens/s": "tok/s", "tokens_per_sec": "tok/s", "tokens_per_second": "tok/s", "tps": "tok/s",
    "wps": "tok/s", "tgs": "tok/s/GPU", "tokens per second": "tok/s", "tokens per gpu per second (tgs)": "tok/s/GPU",
    "tokens per gpu per second": "tok/s/GPU", "throughput": "tok/s", "it/s": "it/s", "samples/s": "samples/s",
    "samples/sec": "samples/s", "samples per second": "samples/s", "train_samples_per_second": "samples/s",
    "samples_per_second": "samples/s", "img/s": "img/s", "images/s": "img/s", "ips": "img/s",
}
# Rates named by their key, however spelled (`RunningAvgSamplesPerSec`, `train/tokens_per_sec`, `tgs`),
# as (pattern over the key with everything but letters, digits and / removed, unit), in preference order.
RATE_KEY_PATTERNS = tuple((re.compile(p), unit) for p, unit in (
    (r"(?:tok|token)s?(?:/s(?:ec(?:ond)?)?|pers(?:ec(?:ond)?)?)$|^(?:tps|wps)$|tokens/s/", "tok/s"),
    (r"(?:tok|token)s?pergpupersecond|^tgs$|tokenspergpupersecondtgs|(?:tok|token)s?(?:/s|pers(?:ec)?)(?:/?(?:per)?(?:gpu|device))$",
     "tok/s/GPU"),
    (r"(?:sample|samples|ex|example|examples|seq|seqs|sequences)(?:/s(?:ec(?:ond)?)?|pers(?:ec(?:ond)?)?)$", "samples/s"),
    (r"^(?:train)?(?:it|iter|iters|step|steps)(?:/s(?:ec)?|pers(?:ec(?:ond)?)?)$", "it/s"),
    (r"^(?:img|imgs|images)(?:/s|pers(?:ec)?)$", "img/s"),
    (r"tflops?/s/(?:gpu|device)|throughputpergputflop/s/gpu|tflopspergpu", "TFLOP/s/GPU"),
    (r"^fps|fps$", "fps"),  # RL's environment frames per second (rl_games' `fps step: … fps total: …`)
))
RATE_PREFERENCE = ("tok/s", "tok/s/GPU", "samples/s", "it/s", "img/s", "TFLOP/s/GPU", "fps")
STEP_TIME_KEYS = {  # key -> seconds per unit of its value
    "time": 1.0, "iter time (s)": 1.0, "iter_time": 1.0, "elapsed time per iteration (ms)": 0.001, "dt": 1.0,
    "step_time": 1.0, "time/step": 1.0, "batch_time": 1.0,
}
# Prefixes a key's phrase may carry that do not change what it names ("Average Loss", "train loss").
_NOISE_WORDS = {"average", "avg", "mean", "train", "training", "total", "running", "current", "smoothed", "reduced"}

# --- numbers ----------------------------------------------------------------------------------

# A thousands separator groups three digits; the comma after the last group may be the list's (`iter:  20,400,
# lr:` is 20400, KAIR and BasicSR print so), a comma before another digit may not (`1,2,3` is a list). A full
# stop after a number ends its sentence (`Total num frames: 438272.`); one before a digit makes a version (`1.2.3`).
_NUM = (r"(?<![\w.])(?P<num>[-+]?(?:\d{1,3}(?:,\d{3})+(?!\d|,\d)|\d+)(?:\.\d+)?(?:[eE][-+]?\d+)?(?!\d|\.\d|\.\w)"
        r"|[-+]?\.\d+(?:[eE][-+]?\d+)?(?![\d.])|(?i:[-+]?nan|[-+]?inf(?:inity)?)(?![A-Za-z]))")
_RATE_UNIT = r"(?:[A-Za-z]+/s(?:ec)?|s/it)\b"
_CLOCK = re.compile(r"(?<![\w.:])(?P<clock>\d{1,3}:\d\d(?::\d\d)?(?:\.\d+)?)(?![\w:])")  # 0:00:01, 12:34 — one duration
_NUMBER = re.compile(_CLOCK.pattern + "|" + _NUM + r"(?P<scale>[kKMGT](?![A-Za-z]))?"
                     rf"(?P<unit>[ \t]?{_RATE_UNIT}(?![ \t]*[=:])|%|ms\b|s\b(?!/)|[KMGT]i?B\b|[MG]b\b)?"
                     r"(?:[ \t]*/[ \t]*(?P<total>\d[\d,]*)(?![\d.]))?")
_SEPARATORS = " \t'\":=[(#"  # and `Trial #63`'s number sign
_WORD = re.compile(r"(?:\([\w/ ]{1,30}\)|[A-Za-z_][\w./%-]*)\Z")
_NOT_KEY_WORDS = {"nan", "inf", "infinity", "e"}
_QUALIFIED = re.compile(r"(?<![\w.])[A-Za-z_]\w*\Z")  # a word glued to the parenthesised qualifier after it
# A source location's line number (`train_dreambooth_colossalai.py:692 main`, rich's and Python logging's
# `%(pathname)s:%(lineno)d`): no quantity of the run, whatever the file's name says.
_SOURCE_LINE = re.compile(r"\w\.(?:py|pyx|cc|cpp|cu|c|h|hpp|rs|go|java|js|ts|lua|jl):\Z")
_SCALE = {"k": 1e3, "K": 1e3, "M": 1e6, "G": 1e9, "T": 1e12}


@dataclass(frozen=True)
class Field:
    """One number on a line and what names it."""

    key: str  # the phrase before it, lower case ("lm loss", "iteration", "s"); "" when none
    value: float
    is_int: bool
    start: int  # where the number starts in the line
    total: int | None = None  # "8/20": 20
    unit: str = ""  # what follows it: "tok/s", "ms", "%", "k"…
    end: int = 0  # where the number (its unit and total included) ends

    @property
    def word(self) -> str:
        """The last word of the key: "lm loss" -> "loss", "Average Loss" -> "loss"."""
        return self.key.rsplit(" ", 1)[-1] if self.key else ""

    @property
    def finite(self) -> bool:
        return self.value == self.value and abs(self.value) != float("inf")


def number(text: str) -> float | None:
    try:
        return float(text.replace(",", ""))
    except ValueError:
        return None


MAX_FIELDS = 100  # a progress line names a few dozen numbers at most; a dump of thousands is no such line


# A file path: two slashes or more and a name with letters among its parts (`/zhome/59/9/198225/Desktop/x.py`,
# `runs/exp12/weights`); `2966/3300/3300` (tesstrain's iteration/learning/total) has no letters and stays numbers.
# Only a part that starts with its number is skipped: a checkpoint's name says its step (`iter-000031-ckpt.pth`).
_PATH = re.compile(r"(?<![\w.~/-])[\w.~-]*(?:/[\w.~-]*){2,}")


def _paths(text: str) -> list[tuple[int, int]]:
    return [m.span() for m in _PATH.finditer(text) if re.search(r"[A-Za-z]{2}", m[0])]


# Four numbers or more joined by slashes are a tuple, not counters: an ASR scorer's `C/S/I/D: 20641/11172/4651/6467`,
# BLEU's n-gram precisions. Three may be a counter and its totals (tesstrain's `2966/3300/3300`).
_TUPLE = re.compile(r"(?<![\w./])\d[\d.]*(?:[ \t]*/[ \t]*\d[\d.]*){3,}(?![\w/])")


def fields(text: str, limit: int = MAX_FIELDS) -> list[Field]:
    """Every number in a line with the key phrase before it: `step=10`, `'loss': '2.3'`, `| lm loss: 7.4E+00 |`,
    `iter 10:`, `s:10000 trl:3.38`, `Epoch [1][659/742]`, `41.3k tok/s` — the first `limit` of them."""
    out: list[Field] = []
    paths = _paths(text) if text.count("/") >= 2 else ()
    tuples = [m.span() for m in _TUPLE.finditer(text)] if text.count("/") >= 3 else ()
    for m in _NUMBER.finditer(text):
        if len(out) >= limit:
            break
        if paths and text[m.start() - 1:m.start()] == "/" and any(a <= m.start() < b for a, b in paths):
            continue  # a directory named by a number (`/zhome/59/9/198225/Desktop/…`), not a count; `iter-000031-ckpt` is
        if m["clock"]:
            parts = [float(p) for p in m["clock"].split(":")]
            seconds = sum(p * 60 ** i for i, p in enumerate(reversed(parts)))
            out.append(Field(_key_before(text, m.start()), seconds, False, m.start(), None, "clock", m.end()))
            continue
        raw = m["num"]
        value = number(raw)
        if value is None or _SOURCE_LINE.search(text, max(0, m.start() - 12), m.start()):
            continue
        unit = (m["unit"] or "").strip()
        if m["scale"]:
            value *= _SCALE[m["scale"]]
        key = _glued_key(text, m.end()) or _key_before(text, m.start())
        is_int = re.fullmatch(r"[-+]?\d[\d,]*", raw) is not None
        total = int(m["total"].replace(",", "")) if m["total"] and is_int else None
        if total is not None and tuples and any(a <= m.start() < b for a, b in tuples):
            total = None
        out.append(Field(key, value, is_int, m.start(), total, unit, m.end()))
    return out


# ESPnet2 names its numbers by the word glued after them: `2epoch:train:1-375batch:` is epoch 2, batch 375.
_GLUED_KEY = re.compile(r"(epoch|batch|step|iter)(?=[:\s,]|$)")


def _glued_key(text: str, end: int) -> str:
    m = _GLUED_KEY.match(text, end)
    return m[1] if m else ""


def _key_before(text: str, start: int) -> str:
    """The words naming the number at `start`: back over `=`, `:`, quotes and an opening bracket, then up to
    six words joined by single spaces ("elapsed time per iteration (ms)"), stopping at anything else."""
    left = text[max(0, start - 100):start].rstrip(_SEPARATORS)
    words: list[str] = []
    while left and len(words) < 6:
        m = _WORD.search(left)
        if not m or m[0].lower() in _NOT_KEY_WORDS:
            break
        if m[0].startswith("(") and (named := _QUALIFIED.search(left[: m.start()])):
            # MMEngine's `Epoch(train) [4][5/5]`, `Iter(val) [50]`: the word before the qualifier names the number
            m = named
        words.insert(0, m[0])
        left = left[: m.start()]
        if left.endswith("--") and len(words) == 1 and (len(left) == 2 or left[-3] in " \t'\""):
            return "--" + _normal_key(words[0])  # a command line's `--epochs 30`: a setting, named as one
        if not left.endswith(" ") or left.endswith("  ") or not left.strip():
            break
        left = left[:-1]
    return _normal_key(" ".join(words))


def _normal_key(phrase: str) -> str:
    words = phrase.lower().replace("'", "").replace('"', "").split()
    # "INFO:root:Epoch" is one word to the splitter: its key is what follows the last colon.
    if words and ":" in words[0]:
        words[0] = words[0].rsplit(":", 1)[-1]
    return " ".join(w for w in words if w)


def is_loss_key(key: str) -> bool:
    if not key:
        return False
    last = key.rsplit(" ", 1)[-1]
    return "loss" in key or last in LOSS_ALIASES[:2]


# --- evaluation words -----------------------------------------------------------------------
# The one vocabulary of evaluation passes: a key, a line or a bar named so reports an evaluation's results or
# progress, never the training loop's. (word, where it counts, what a headline calls it, where it comes from.)
# "anywhere": in a key, anywhere in a line; "label": a short word only as the line's own label, before its first
# number — `loss: 0.3 val 0.4` is a training line that prints a validation figure.
EVAL_WORDS = (
    (r"eval\w*", "anywhere", "evaluation", "HF Trainer's eval_loss and `***** Running Evaluation *****`, TRL, DeepSpeed-Chat"),
    (r"valid\w*", "anywhere", "validation", "fairseq's `valid on 'valid' subset`, Lightning's Validation bar, nnU-Net"),
    (r"test(?:ing)?", "anywhere", "test", "MMEngine's `Epoch(test)`, Lightning's Testing bar"),
    (r"inference", "anywhere", "inference", "detectron2's `Start inference on N batches`"),
    (r"val", "label", "validation", "MMEngine's `Epoch(val) [4][1/8]` and `Iter(val)`, Lightning's val_loss, YOLO"),
    (r"dev", "label", "dev set", "PaddleNLP and other NLP loops' `dev step: 50 - loss: …` (the dev split)"),
    (r"predict\w*", "label", "prediction", "PaddleNLP's and HF's `Running Prediction`, Lightning's Predicting bar"),
    (r"sanity", "label", "sanity check", "Lightning's `Sanity Checking` bar"),
)
_ANYWHERE = "|".join(w for w, where, _, _ in EVAL_WORDS if where == "anywhere")
_ALL_EVAL = "|".join(w for w, *_ in EVAL_WORDS)
EVAL_WORD = re.compile(rf"(?i)\b(?:{_ALL_EVAL})\b")  # in a bar's description, which is all label
_EVAL_KEY = re.compile(rf"(?:^|[ _/])(?:{_ALL_EVAL})(?:$|[ _/])|^(?:{_ANYWHERE})")
_EVAL_LINE = re.compile(rf"(?i)\b(?:{_ANYWHERE})\b|^[^#]*\b(?:{_ALL_EVAL})\b")


def is_eval_key(key: str) -> bool:
    return bool(_EVAL_KEY.search(key))


def is_eval_template(tpl: str) -> bool:
    """An evaluation's line: an evaluation word anywhere, or a short one as its label (before its first number)."""
    return bool(_EVAL_LINE.search(tpl))


def eval_noun(text: str) -> str:
    """What a headline calls the evaluation a text names: "validation" for `Epoch(val)`, "dev set" for `dev step`."""
    for word, _, noun, _ in EVAL_WORDS:
        if re.search(rf"(?i)\b{word}\b", text):
            return noun
    return "evaluation"


# --- summary blocks ---------------------------------------------------------------------------
# A trainer's summary block is configuration, printed once (or again at each evaluation), never progress: its
# lines are `key phrase = value` and nothing else, whatever the words. The shapes seen, with where each comes
# from (tests hold SETTING to every one).
SUMMARY_LINES = (
    ("  Num examples = 1,000", "HF Trainer's `***** Running training *****` block (transformers 4 and 5, TRL, LLaMA-Factory)"),
    ("  Total optimization steps = 2,290", "HF Trainer's training block"),
    ("  Total train batch size (w. parallel, distributed & accumulation) = 32", "HF Trainer's training block"),
    ("  Number of trainable parameters = 4,194,304", "HF Trainer's training block"),
    ("  Total prediction steps = 3", "PaddleNLP Trainer's `***** Running Evaluation *****` block, at every evaluation"),
    ("  Total optimization steps = 1300.0", "PaddleNLP Trainer's training block"),
    ("  train_runtime            = 0:10:12.34", "HF Trainer's `***** train metrics *****` block"),
    ("  epoch                    =        3.0", "HF Trainer's metrics blocks"),
    ("scale_loss                    :32768", "PaddleNLP's `Training Configuration Arguments` table (a padded name, `:`)"),
)
SETTING = re.compile(r"[A-Za-z][A-Za-z_ .()/&,'-]{0,100}?(?:[ \t]+=[ \t]+|[ \t]{2,}:[ \t]*)[-+]?[\d.,:]+(?:[eE][-+]?\d+)?[ \t]*")


def is_setting(text: str) -> bool:
    """A summary block's line: a phrase of words (no number in it), " = " or a name padded to its column and
    `:`, one value, nothing after."""
    return (" = " in text or "  :" in text) and SETTING.fullmatch(message(text)) is not None


# --- templates ------------------------------------------------------------------------------
# Lines printed by the same statement share a template: the text with its numbers taken out.

_TEMPLATE_NUM = re.compile(_CLOCK.pattern + "|" + _NUM)
_BAR_BODY = re.compile(r"\|[ █▉▊▋▌▍▎▏#=>.\-━╸╺]{0,120}\|")  # tqdm's bar between pipes changes every frame


def template(text: str) -> str:
    """The line with its numbers taken out, and the blanks around them: right-aligned numbers pad themselves
    (`Epoch: [2] [  0/464]`, `[200/464]`; `epoch:  9`, `epoch: 10`), and the padding goes with the number, or
    one statement would print a new template whenever a number grew a digit. (Split and joined, not one regex
    with blanks around the number: that one was twice as slow, and quadratic in a run of blanks.)"""
    shape = _TEMPLATE_NUM.sub("#", _BAR_BODY.sub("|#|", text))
    return "#".join(part.strip(" \t") for part in shape.split("#")).strip()


# --- line timestamps ------------------------------------------------------------------------
# Many loggers stamp each line; the last progress line's stamp says when progress was made, even
# while heartbeats and warnings keep the file's mtime fresh. Stamps are compared with each other,
# never with a clock: their time zone is unknown.

_STAMPS = (
    (re.compile(r"(\d{4})-(\d\d)-(\d\d)[ T](\d\d):(\d\d):(\d\d)(?:[.,](\d{1,6}))?"), "ymdhms"),
    (re.compile(r"(\d{4})/(\d\d)/(\d\d)[ T](\d\d):(\d\d):(\d\d)(?:[.,](\d{1,6}))?"), "ymdhms"),
    (re.compile(r"^\[?(\d\d)/(\d\d) (\d\d):(\d\d):(\d\d)\]"), "mdhms"),  # detectron2: [11/17 11:38:28]
    (re.compile(r"^[IWEF](\d\d)(\d\d) (\d\d):(\d\d):(\d\d)(?:\.(\d{1,6}))?"), "mdhms"),  # glog: I1130 10:00:00.123
    # a month's name: syslog's `Mar 29 16:34:28`, ColBERT's `[Mar 29, 16:34:28]`, ctime's `Wed Dec  2 21:17:46 2026`
    (re.compile(r"^\[?(?:(?:Mon|Tue|Wed|Thu|Fri|Sat|Sun),? )?(Jan|Feb|Mar|Apr|May|Jun|Jul|Aug|Sep|Oct|Nov|Dec) {1,2}(\d{1,2}),? "
                r"(\d\d):(\d\d):(\d\d)(?:[.,](\d{1,6}))?"), "bdhms"),
)
_MONTHS = {m: i for i, m in enumerate("Jan Feb Mar Apr May Jun Jul Aug Sep Oct Nov Dec".split(), 1)}


class LineStamps(Sequence):
    """Each line's own stamp, read when first asked for: a 64 KiB window has some 1500 lines and a
    verdict reads the stamps of a few (its steps, the last lines); reading all was 1/5 of a probe's CPU."""

    def __init__(self, lines: Sequence[str]) -> None:
        self._lines = lines
        self._read: dict[int, float | None] = {}

    def __len__(self) -> int:
        return len(self._lines)

    def __getitem__(self, i):  # type: ignore[override]
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        if i < 0:
            i += len(self)
        if not 0 <= i < len(self):
            raise IndexError(i)
        if i not in self._read:
            self._read[i] = line_time(self._lines[i])
        return self._read[i]

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Sequence) and list(self) == list(other)

    __hash__ = None  # type: ignore[assignment]


def line_time(text: str) -> float | None:
    """Seconds of the line's own stamp, on an arbitrary but consistent scale; None without one."""
    head = text[:120]
    for pattern, shape in _STAMPS:
        m = pattern.search(head)
        if not m:
            continue
        try:
            if shape == "ymdhms":
                y, mo, d, h, mi, s = (int(x) for x in m.groups()[:6])
                frac = m.group(7)
            elif shape == "bdhms":
                y, mo, (d, h, mi, s), frac = 2000, _MONTHS[m[1]], (int(x) for x in m.groups()[1:5]), m.group(6)
            else:
                y, (mo, d, h, mi, s), frac = 2000, (int(x) for x in m.groups()[:5]), (m.group(6) if m.lastindex and m.lastindex >= 6 else None)
            when = datetime(y, mo, d, h, mi, s).timestamp()  # naive: only differences are used
        except (ValueError, OverflowError):
            continue
        return when + (float(f"0.{frac}") if frac else 0.0)
    return None


# detectron2 puts the level before its stamp (`WARNING [06/09 11:05:25 d2.x]:`), a paste may bold it (`**ERROR [06/09 …`).
_LEADING_STAMP = re.compile(
    r"^[ \t]*\**(?:(?:DEBUG|INFO|WARNING|ERROR|CRITICAL)[ \t]+)?\[?(?:[DIWEC][ \t]+(?=\d{4}[-/]))?(?:\d{4}[-/]\d\d[-/]\d\d[ T]\d\d:\d\d:\d\d(?:[.,]\d{1,6})?(?:Z|[+-]\d\d:?\d\d)?"
    r"|\d\d/\d\d \d\d:\d\d:\d\d|[IWEF]\d{4} \d\d:\d\d:\d\d(?:\.\d{1,6})?(?:[ \t]+\d+)?"
    r"|(?:(?:Mon|Tue|Wed|Thu|Fri|Sat|Sun),? )?(?:Jan|Feb|Mar|Apr|May|Jun|Jul|Aug|Sep|Oct|Nov|Dec) {1,2}\d{1,2},? \d\d:\d\d:\d\d(?:[.,]\d{1,6})?(?: \d{4})?)"
    r"(?:[ \t]+[\w./-]+(?=\]))?\]?\**[ \t]*[|:-]?[ \t]*")  # Swin's and its heirs' `[2024-09-24 10:41:58 ViT-B/16]` names its logger


def strip_stamp(text: str) -> str:
    """A line without the timestamp its logger put first (its numbers are not the run's)."""
    return _LEADING_STAMP.sub("", text, count=1) if text[:1].isdigit() or text[:1] in " \t[IWEFDC*JMASONT" else text


# --- prefixes and frames --------------------------------------------------------------------

# torchrun (`[rank3]:`, `[default0]:`), mpirun (`[1,3]<stderr>:`, SageMaker's `[1,mpirank:0,algo-1]<stdout>:`)
# and srun --label (`6: `, only before a bracket: a bare "6: " may be a list), a `0 | ` column before a date.
RANK_PREFIX = re.compile(r"^[ \t]*(?:\[(?:rank|default)(\d+)\]:|\[\d+,(\d+)\]<std(?:out|err)>:"
                         r"|\[(\d+),mpirank:\d+[^\]]*\]<std(?:out|err)>:|(\d{1,5}): (?=\[)"
                         # a rank column before the stamp: `0 | 2023-06-01 02:22:35,218 - INFO - …`
                         r"|(\d{1,5}) \| (?=\d{4}-\d\d-\d\d)"
                         r"|\[rank:[ \t]*(\d{1,5})\]) ?")  # ParlAI's `[rank:  1] [ running eval: valid ]`
# pdsh: "v100x16-2: …", "192.168.205.202: …", "localhost: …" (lower case: `torch.OutOfMemoryError: …` is no host)
_HOST_PREFIX = re.compile(r"^[ \t]*(?:\d{1,3}(?:\.\d{1,3}){3}|localhost|[a-z][a-z0-9-]{0,30}\d[a-z0-9-]*(?:\.[a-z0-9-]+)*):(?: (?=\S)|[ \t]*$)")


def split_rank_prefix(text: str) -> tuple[int | None, str]:
    """Strip torchrun (`[rank3]:`, `[default0]:`) and mpirun (`[1,3]<stderr>:`) line prefixes."""
    rank = None
    while m := RANK_PREFIX.match(text):
        value = m[1] or m[2] or m[3] or m[4] or m[5] or m[6]
        rank = int(value) if rank is None and len(value) < 7 else rank
        text = text[m.end():]
    return rank, text


def strip_host_prefix(text: str) -> str:
    """pdsh and some MPI launchers put "host: " before every line."""
    m = _HOST_PREFIX.match(text)
    return text[m.end():] if m else text


# What loggers put before the words: "[INFO] [file.py:21:save]", "fvcore.common.checkpoint INFO:",
# "root - INFO - ", "INFO:root:", "megatron.training | INFO |", Megatron's " > " bullets.
_LOGGER = re.compile(
    r"^(?:\[[^\]]{0,80}\][ \t]*){1,3}(?:[\w./-]+:\d+(?::\w+)?\]?[ \t]*(?:>>|-)?[ \t]*|-[ \t]+)?"
    r"|^[\w.]+(?: +\w+)? +\|[^|]*\|[ \t]*[\w.:]+ - "
    r"|^(?:[\w.]+[ \t]+(?:-[ \t]+)?)?(?:INFO|WARNING|WARN|DEBUG|NOTICE)\b(?::[\w.]+:|[ \t]*[:|-][ \t]*|[ \t]+)"
    r"|^[ \t]*>+[ \t]+"
    r"|^[\w./-]+\.(?:py|cc|cpp|h|go|rs):\d+\][ \t]*"  # a source location closing a C-style prefix: Paddle's `launch_utils.py:545] `
    r"|^\([\w./-]+\.py[ \t]+\d+\):[ \t]*(?:(?:INFO|WARNING|WARN|DEBUG)[ \t]+)?"  # Swin's heirs: `(main.py 188): INFO `
    r"|^\((?:INFO|WARNING|WARN|DEBUG|NOTICE)\):[ \t]*")  # Open Catalyst's `%(asctime)s (%(levelname)s): `


def message(text: str) -> str:
    """A line's own words, without the launcher's, the host's, the stamp's and the logger's prefixes."""
    text = strip_host_prefix(split_rank_prefix(text)[1]).strip()
    for _ in range(3):
        shorter = _LOGGER.sub("", strip_stamp(text), count=1).strip()
        if shorter == text or not shorter:
            break
        text = shorter
    return text


def last_frame(text: str) -> str:
    """What a terminal would show of a line tqdm rewrote with \\r: its last non-blank frame."""
    if "\r" not in text:
        return text if text.strip() else ""
    return next((f for f in reversed(text.split("\r")) if f.strip()), "")


def parse_int(s: str | None) -> int | None:
    s = (s or "").replace(",", "")
    return int(s) if s.isdigit() and len(s) < 19 else None


# --- the remote pre-filter ------------------------------------------------------------------


def _ci(word: str) -> str:
    return "".join(f"[{c.upper()}{c.lower()}]" if c.isalpha() else (f"[{c}]" if c in "/." else c) for c in word)


@functools.cache  # a constant of the grammar: built once, not for every probe script (1 ms each, on the loop)
def prefilter_ere() -> str:
    """One POSIX ERE for `grep -aE` that keeps every line a progress recogniser may read: a loss, a rate,
    a step or epoch key before a number, or an n/total counter. Broad on purpose (the window is parsed
    whole; this only finds progress lines that lie further back than the window), bounded in cost (no
    backreferences: GNU grep runs it as a DFA). Run it with LC_ALL=C."""
    # Singular keys only: "warmup steps: 100" and "Total optimization steps = 1,000" are settings
    # (DeepSpeed's pipeline `steps: 8 loss: 12.4` has its loss to be found by).
    keys = sorted({k for k in STEP_KEYS + EPOCH_KEYS if len(k) > 2 and " " not in k and "/" not in k
                   and not k.endswith("s")} | {"num_updates"})
    # Not it/s: every tqdm frame shows one (a loop's own bar is read from the window).
    units = sorted({u.split("/")[0] for u in RATE_UNITS if not u.startswith(("it/", "s/", "step"))} | {"tps", "wps", "tgs"})
    parts = [
        _ci("loss"), _ci("trl") + "[ \t]*[:=]",
        # a quoted key may touch its number: `"step"12` reads as step 12 to the parser
        "(" + "|".join(_ci(k) for k in keys) + ")([ \t]*['\"]?[ \t]*[:=[ \t]+|['\"])[ \t]*[0-9]",
        "[0-9][ \t]*/[ \t]*[0-9]+[ \t]*[]|]",  # Megatron `8/ 20 |`, mmcv `[659/742]` (a tqdm frame has `131/851 [`)
        "[0-9][ \t]?(" + "|".join(_ci(u) for u in units) + ")[/]",
        "[0-9]+[ \t]?(" + "|".join(_ci(u) for u in ("tps", "wps", "tgs")) + ")",
        # a rate named by its key: tok/s=…, tokens_per_sec: …, samples/s=…, RunningAvgSamplesPerSec=…
        "(" + "|".join(_ci(u) for u in ("tok", "tps", "wps", "tgs", "sample", "throughput", "persec")) + ")[^ \t=:]*[ \t]*['\"]?[ \t]*([=:]|[ \t][0-9])",
    ]
    return "|".join(f"({p})" for p in parts)
