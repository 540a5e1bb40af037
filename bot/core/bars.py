"""Pure: progress bars (tqdm frames, Lightning's rich bar, Keras' bar) found anywhere in a line, and what each bar is for."""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass

from bot.core.grammar import EVAL_WORD, split_rank_prefix


class Role(str, enum.Enum):
    """What a bar measures, from its description and its place (never from whether it is open)."""

    TRAINING = "training"  # the trainer's own loop (HF's bar with no description, `Epoch 3:`, `Steps:`)
    EVALUATING = "evaluating"
    LOADING = "loading"  # weights, checkpoint shards, downloads
    PREPARING = "preparing"  # dataset map / tokenize / filter / cache
    SAVING = "saving"
    OTHER = "other"  # a description we cannot place


# The one vocabulary of bar roles: (role, words in the description, where they come from). First match wins:
# "Loading checkpoint shards" is loading, "Saving checkpoint" saving, "Generating samples" an evaluation.
_ROLE_WORDS = (
    (Role.EVALUATING, EVAL_WORD.pattern, "grammar.EVAL_WORDS: HF's eval bar, Lightning's Validation / Testing / "
                                         "Sanity Checking / Predicting, MMEngine's val"),
    (Role.EVALUATING, r"(?i)infer|benchmark", "vLLM's and detectron2's inference bars, benchmark scripts"),
    (Role.EVALUATING, r"(?i)generat(?:e|ing) (?:samples|images)", "diffusers' and kohya's sample generation during training"),
    (Role.SAVING, r"(?i)sav|writ|serializ", "HF's `Writing model shards`, `Saving checkpoint` bars"),
    (Role.SAVING, r"(?i)upload|export|push|convert", "huggingface_hub's `Upload N LFS files`, export and conversion scripts"),
    (Role.LOADING, r"(?i)load|shard|weight|checkpoint|\bckpt", "HF's `Loading checkpoint shards`, `Loading weights`"),
    (Role.LOADING, r"(?i)download|fetch", "huggingface_hub's `Fetching 4 files`, `Downloading shards`"),
    (Role.LOADING, r"(?i)materializ|restor|resum", "accelerate's and Lightning's restore / resume"),
    (Role.LOADING, r"(?i)quantiz", "ai-toolkit's and optimum-quanto's `quantizing 40 transformer blocks` as a model loads"),
    (Role.PREPARING, r"(?i)\bmap\b|filter|group|pack|concat|shuffl|split|generat|datasets?\b",
     "HF datasets' `Map`, `Filter`, `Generating train split`, run_clm's `Grouping texts`, TRL's packing"),
    (Role.PREPARING, r"(?i)token|preprocess|process|prepar|cach|build|index|read|extract|encod|collat",
     "HF examples' `Running tokenizer on dataset`, Megatron's index building, data readers and caches"),
    (Role.TRAINING, r"^$", "HF Trainer's loop bar, drawn with no description"),
    (Role.TRAINING, r"(?i)epoch|step|train|iter|batch|\bfit\b|^it$|optimi",
     "Lightning's `Epoch 3`, diffusers' `Steps`, hand-written loops' `Training` / `Iteration` bars"),
)
_ROLES = [(role, re.compile(words)) for role, words, _ in _ROLE_WORDS]

_Q = r"\d+(?:\.\d+)?(?:[kKMGTPEZY]i?)?"
# tqdm: `{desc}: {pct}%|{bar}| {n}/{total} [{elapsed}<{remaining}, {rate}{postfix}]`, found anywhere in a
# text (the search index and some loggers glue frames together without their \r).
_TQDM = re.compile(
    rf"(?:(?P<desc>[^\r\n|]{{0,160}}?):[ \t]*)?(?:(?P<pct>\d{{1,3}})%)?\|(?P<bar>[^|\nA-Za-z]{{0,200}})\|[ \t]*(?P<n>{_Q})/(?P<total>{_Q}|\?)"
    r"(?:[ \t]*\[(?P<el>[^<,\]\n]{0,20})(?:<(?P<rem>[^,\]\n]{0,20}))?(?:,[ \t]*(?P<rate>[^,\]\n]{0,40}))?"
    r"(?P<post>,[^\]\n]{0,400})?\])?"
)
# unknown total: `Map: 1310 examples [00:01, 999 examples/s]`, `Epoch 2: : 115816it [7:03:09, 4.56it/s, …]`
_TQDM_OPEN = re.compile(
    rf"(?:(?P<desc>[^\r\n|\[\]]{{0,160}}?):[ \t:]*)?(?P<n>{_Q})[ \t]?(?P<unit>[A-Za-z ]{{0,40}})\[(?P<el>\d+:\d\d(?::\d\d)?),[ \t]*"
    r"(?P<rate>(?:\?|[\d.]+[ \t]?[kMG]?)[ \t]?[A-Za-z ]{0,40}/s|[\d.]+s/[A-Za-z ]{1,40})(?P<post>,[^\]\n]{0,400})?\]"
)
# A bar_format with words between the percentage and the counts (vLLM: `Loading safetensors checkpoint shards:
# 71% Completed | 12/17 [01:21<00:36,  7.20s/it]`).
_TQDM_WORDS = re.compile(
    rf"(?P<desc>[^\r\n|\[\]]{{1,160}}?):[ \t]*(?P<pct>\d{{1,3}})%[ \t]+[A-Za-z][A-Za-z ]{{0,30}}?[ \t]*\\?\|[ \t]*"
    rf"(?P<n>{_Q})/(?P<total>{_Q})[ \t]*\[(?P<el>[^<,\]\n]{{0,20}})(?:<(?P<rem>[^,\]\n]{{0,20}}))?"
    r"(?:,[ \t]*(?P<rate>[^,\]\n]{0,40}))?(?P<post>,[^\]\n]{0,400})?\]"
)
# tqdm with no bar drawn (`bar_format` without `{bar}`, or a log that dropped the block characters, as SageMaker's
# CloudWatch copy does): `Epoch 0: 100% 2/2 [00:00<00:00, 12.33it/s, loss=2.29, v_num=0]`.
_TQDM_BARLESS = re.compile(
    rf"(?P<desc>[^\r\n|\[\]]{{1,160}}?):[ \t]*(?P<pct>\d{{1,3}})%[ \t]+(?P<n>{_Q})/(?P<total>{_Q})[ \t]*"
    r"\[(?P<el>[\d:]{1,12})<(?P<rem>[\d:]{1,12}|\?)(?:,[ \t]*(?P<rate>[^,\]\n]{0,40}))?(?P<post>,[^\]\n]{0,400})?\]"
)
# Lightning's rich bar, rendered once into a file: `Epoch 2/2  ━━━━━━ 50/50 0:00:05 • 0:00:00 9.41it/s train_loss: 8.081`
_RICH = re.compile(r"(?P<desc>Epoch[ \t]+\d+(?:/\d+)?|Validation|Sanity Checking|Testing|Predicting)[ \t]+[━╸╺╾╼─ -]*[ \t]"
                   r"(?P<n>\d+)/(?P<total>\d+)[ \t]+(?P<el>[\d:.]+)[ \t]*•[ \t]*(?P<rem>[-\d:.]+)[ \t]*"
                   r"(?:(?P<rate>[\d.]+it/s))?(?P<post>.*)$")
# Keras: `9595/9595 [==============================] - 1s - loss: nan - acc: 0.0000e+00`
_KERAS = re.compile(r"(?<![\d/])(?P<n>\d+)/(?P<total>\d+)[ \t]+\[(?P<bar>[=>.]{5,60})\][ \t]*(?:-[ \t]*(?:ETA:[ \t]*)?(?P<el>[\d:.]+m?s?))?"
                    r"(?P<post>.*)$")


@dataclass(frozen=True)
class Bar:
    """One frame of a progress bar."""

    desc: str  # "Loading weights"; "" for HF's loop bar
    pct: int | None
    n: int | None
    total: int | None
    rate: str | None = None  # "199.62it/s"
    elapsed: str | None = None
    remaining: str | None = None
    postfix: str = ""  # ", loss=2.3, v_num=0"
    nested: bool = False  # drawn at tqdm position >= 1 (ESC[A after the frame): inside another bar
    role: Role = Role.OTHER
    frame: str = ""  # the frame as printed
    start: int = 0  # where the frame starts in its line
    end: int = 0  # where it ends: text after it (a crash glued to the frame) is the line's own

    @property
    def finished(self) -> bool:
        # At its total, or drawn at 100 %: tqdm rounds 298/299.0 up, a float total the last item never reached.
        return self.total is not None and self.n is not None and (self.n >= self.total or (self.pct or 0) >= 100)

    @property
    def epoch(self) -> int | None:
        m = _EPOCH_DESC.search(self.desc)
        return int(m[1]) if m else None

    @property
    def epoch_total(self) -> int | None:
        """The epochs planned, where the description says (`Epoch 56/400 train`)."""
        m = _EPOCH_DESC.search(self.desc)
        return int(m[2]) if m and m[2] else None


_EPOCH_DESC = re.compile(r"(?:^|\W)Epoch[ \t]+(\d+)(?:[ \t]*/[ \t]*(\d+))?")


def count(q: str | None) -> int | None:
    """tqdm's n_fmt/total_fmt, unit_scale included: `1.2k` -> 1200, `1.00G` -> 10**9."""
    if not q or q == "?" or not (m := re.fullmatch(r"(\d+(?:\.\d+)?)(?:([kKMGTPEZY])(i?))?", q)):
        return None
    power = " kMGTPEZY".index(m[2].replace("K", "k")) if m[2] else 0
    return round(float(m[1]) * (1024 if m[3] else 1000) ** power) if len(m[1]) < 19 else None


def _known(field: str | None) -> str | None:
    return None if not field or "?" in field else field.strip()  # "?" is tqdm's "unknown"


def role_of(desc: str) -> Role:
    text = desc.strip()
    return next((role for role, words in _ROLES if words.search(text)), Role.OTHER)


_BYTES_RATE = re.compile(r"(?i)^[\d.]+[ \t]?(?:[kMGT]i?)?B/s$")


def _role(desc: str, postfix: str, rate: str | None = None) -> Role:
    """A bar that carries a loss is a training loop's, whatever its description says (torchtune: `1|100|Loss: 2.3:`);
    one that moves bytes (`12.3kB/s`) is a transfer, whatever file it names (`training_args.bin`)."""
    if rate and _BYTES_RATE.match(rate.strip()):
        if re.search(r"(?i)upload|push|sav|writ|export", desc):
            return Role.SAVING
        return Role.LOADING if re.search(r"(?i)download|fetch|load|pull|get", desc) else Role.OTHER
    role = role_of(desc)
    if role is Role.OTHER and not EVAL_WORD.search(desc) and (
            re.search(r"(?i)loss", f"{desc} {postfix}") or _METRICS_DESC.search(desc)):
        return Role.TRAINING  # live metrics in the description: `d: -0.001;gen: -0.008`, `1|100|Loss: 2.3`
    return role


_METRICS_DESC = re.compile(r"[A-Za-z_]\w*[ \t]*[:=][ \t]*-?\d")


def _desc(raw: str | None) -> str:
    """A bar's description without log-line prefixes glued before it (`[rank0]: `, a timestamp)."""
    text = split_rank_prefix((raw or "").strip())[1]
    text = re.sub(r"^.*\]\s+", "", text) if re.match(r"^\[", text) else text
    return text.strip(" :")


# A frame cut at the terminal's width never closes its bracket; what it shows of the bracket still counts, and
# a message glued after it (`…, loss=0.123, train_loss_step=0.1Saving checkpoint to …`) is the line's own.
_CUT = re.compile(r"[ \t]*\[(?P<el>[\d:]{1,12})(?:<(?P<rem>[\d:]{1,12}|\?))?(?:,[ \t]*(?P<rate>\??[\d.]*[ \t]?[kMG]?(?:it/s|s/it)))?"
                  r"(?P<post>(?:,[ \t]*[A-Za-z_][\w/.-]{0,40}=[-+]?(?:\d+(?:\.\d+)?(?:e[-+]?\d+)?(?![\d.])|nan|inf))*)")


# What each layout cannot do without, searched first: most lines with a `|` or a `[` are no bar (Megatron's
# `| lm loss: … |`, a logger's `[INFO]`), and the layouts' lazy descriptions are dear to try at every place.
_HINTS = {_TQDM: re.compile(rf"\|[ \t]*{_Q}/(?:{_Q}|\?)"), _TQDM_WORDS: re.compile(r"\d%[ \t]+[A-Za-z]"),
          _TQDM_BARLESS: re.compile(r"\d%[ \t]+\d"), _TQDM_OPEN: re.compile(r"\[\d+:\d\d"), _RICH: re.compile("•"),
          _KERAS: re.compile(r"\[[=>.]{5}")}


def frames(text: str, *, nested: bool = False) -> list[Bar]:
    """Every bar frame in a text, in order (one frame per \\r-redraw, or several glued together)."""
    out: list[Bar] = []
    if "/" not in text:  # every layout shows n/total or a rate
        return out
    for m in (_TQDM.finditer(text) if _HINTS[_TQDM].search(text) else ()):
        desc = _desc(m["desc"])
        cut = _CUT.match(text, m.end()) if m["el"] is None and text[m.end():m.end() + 3].lstrip().startswith("[") else None
        if cut is not None and cut["el"] is not None:
            m = _Joined(m, cut, text)
        if m["pct"] is None and m["el"] is None:
            continue
        rate, post = m["rate"], (m["post"] or "").strip(", ")
        if rate and "=" in rate:  # no rate shown (NeMo): the first postfix item sits where the rate would
            rate, post = None, f"{rate}, {post}".strip(", ")
        out.append(Bar(desc, int(m["pct"]) if m["pct"] else None, count(m["n"]), count(m["total"]), _known(rate), _known(m["el"]),
                       _known(m["rem"]), post, nested, _role(desc, post, rate), m[0].strip(), m.start(), m.end()))
    if out:
        return out
    for pattern in (_TQDM_WORDS, _TQDM_BARLESS, _TQDM_OPEN, _RICH, _KERAS):
        for m in (pattern.finditer(text) if _HINTS[pattern].search(text) else ()):
            groups = m.groupdict()
            desc = _desc(groups.get("desc"))
            total = count(groups.get("total"))
            n = count(groups.get("n"))
            pct = round(100 * n / total) if n is not None and total else None
            out.append(Bar(desc, pct, n, total, _known(groups.get("rate")), _known(groups.get("el")),
                           _known(groups.get("rem")), (groups.get("post") or "").strip(", -"), nested,
                           Role.TRAINING if pattern is _KERAS else _role(desc, groups.get("post") or "", groups.get("rate")),
                           m[0].strip(), m.start(), m.end()))
        if out:
            return out
    return out


class _Joined:
    """A frame's match and the cut bracket after it, read as one match."""

    def __init__(self, head: re.Match, tail: re.Match, text: str) -> None:
        self._groups = {**head.groupdict(), **{k: v for k, v in tail.groupdict().items() if v is not None}}
        self._start, self._end, self._text = head.start(), tail.end(), text

    def __getitem__(self, key):
        return self._text[self._start:self._end] if key == 0 else self._groups.get(key)

    def start(self) -> int:
        return self._start

    def end(self) -> int:
        return self._end


def last_bar(text: str, *, nested: bool = False) -> Bar | None:
    found = frames(text, nested=nested) if ("|" in text or "[" in text or "━" in text) else []
    return found[-1] if found else None
