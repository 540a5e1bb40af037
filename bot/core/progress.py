"""Pure: a run's progress lines found by their structure — the same template printed again and again with
one integer that advances — and the loss, rate, epoch and total their neighbours name."""

from __future__ import annotations

import math
import re
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import NamedTuple

from bot.core.bars import Bar
from bot.core.facts import Step
from bot.core.learned import MAX_SIGHTINGS, MAX_TEMPLATE, CounterRule, Sighting
from bot.core.grammar import (
    number,
    MAX_FIELDS,
    RATE_KEY_PATTERNS,
    RATE_PREFERENCE,
    EPOCH_KEYS,
    split_rank_prefix,
    strip_host_prefix,
    strip_stamp,
    RATE_KEYS,
    RATE_UNITS,
    STEP_KEYS,
    STEP_TIME_KEYS,
    Field,
    fields,
    is_eval_key,
    is_eval_template,
    is_loss_key,
    is_setting,
    template,
)

KEPT_STEPS = 8  # enough for the rate, the loss, NaN's onset and a learned step interval
READ_PER_TEMPLATE = 48  # lines of one template read closely: several epochs of a counter that restarts each epoch
# Lines that carry numbers but are not a loop's progress: tracebacks and code quoted in them,
# config dumps (`learning_rate .......... 0.0001`, `--max_steps 1000`), launcher arguments, and W&B's console
# (`wandb: train/global_step 260`: its run summary at exit, never the loop's own line).
_NOT_PROGRESS = re.compile(r'^[ \t]*(?:File "|Traceback|During handling|The above exception|raise |return |[\w.]+\(|wandb: )'
                           r"|\w\.{4,}|^[ \t]*--?[\w-]+[ \t=]|\b(?:argv|args|cmd|config|Namespace)\b[ \t]*[=:(]"
                           r"|^[\w.]*(?:Error|Exception|Warning)\b:|warnings?\.warn|\bwarn(?:ing)?:|^[ \t]*\w+ = ", re.I)
# Results printed once at the end, which look like step lines: HF's metrics dict, throughput summaries.
END_METRICS = re.compile(r"(?i)['\"]?train_runtime['\"]?\s*[:=]|train_samples_per_second|Overall training speed")
_STEP_PREFERENCE = {k: i for i, k in enumerate(STEP_KEYS)}
# A tqdm or Keras frame: read by bot.core.bars, whose role (loading, evaluating, the loop…) decides.
_IS_BAR = re.compile(r"\d%\|[^|]{0,200}\|[ \t]*\d|\d%[ \t]+\d+(?:\.\d+)?[kMG]?/\d+(?:\.\d+)?[kMG]?[ \t]*\[[\d:]+<|\d%[ \t]+[A-Za-z][A-Za-z ]{0,30}\\?\|[ \t]*\d+/\d+[ \t]*\[|\d/\d+[ \t]+\[[=>.]{5,}\]|(?<!\d)\d+(?:it|[ \t]?examples)[ \t]*\[\d+:\d\d")
_METRIC_WORDS = re.compile(r"loss|lr|learning|norm|acc|ppl|perplexity|mfu|flops|tok|time|elapsed|eta|speed|throughput|reward|"
                           r"grad|score|map|miou|dice|bleu|psnr|error|err\b|kl|entropy", re.I)


@dataclass(frozen=True)
class _Line:
    index: int
    text: str
    template: str
    fields: tuple[Field, ...]
    cleaned: str = ""

    def text_after(self, f: Field) -> str:
        return self.cleaned[f.end:f.end + 3]


_COMPOUND = re.compile(r"^(?:training|train|env|agent|current|cur)_(iteration|step|episode|round|trial|update)$")


def _named_as(f: Field) -> int | None:
    """Where the key ranks among the step keys: its own, its last word's, or a compound's last part (RLlib's
    `training_iteration: 27`)."""
    if (named := _STEP_PREFERENCE.get(f.key, _STEP_PREFERENCE.get(f.word))) is not None or "_" not in f.key:
        return named
    compound = _COMPOUND.match(f.key)
    return _STEP_PREFERENCE.get(compound[1]) if compound else None


def _counter(f: Field) -> bool:
    return f.is_int and f.value >= 0 and f.finite and (_named_as(f) is not None or f.total is not None)


def _epoch_field(fs: Sequence[Field]) -> Field | None:
    return next((f for f in fs if f.word in EPOCH_KEYS or f.key in EPOCH_KEYS), None)


def _metric(fs: Sequence[Field]) -> bool:
    """A number a training loop reports: a loss, a rate, a learning rate, a time… (not an address or a count)."""
    return any(is_loss_key(f.key) or (f.key and _METRIC_WORDS.search(f.key)) or f.unit in RATE_UNITS
               or (f.key and _rate_unit_of_key(f.key)) for f in fs)


def clean(text: str) -> str:
    """A line as its loop printed it: no rank, host or timestamp prefix (their numbers are not the run's)."""
    return strip_stamp(strip_host_prefix(split_rank_prefix(text)[1])).strip()


def read_line(text: str, *, alone: bool = True) -> Step | None:
    """One cleaned line read as a progress line. `alone`: it must say so by itself — a step key or an
    n/total counter beside a metric, or a loss beside a rate — since no series vouches for it."""
    line = _candidate(0, text)
    if line is None or (alone and (END_METRICS.search(text) or is_eval_template(line.template))):
        return None
    fs = line.fields
    ok = [i for i, f in enumerate(fs) if f.is_int and f.finite and f.value >= 0]
    # "completed step: 100" names its step; "Training steps: 1000" (plural) is a setting.
    has_loss = any(is_loss_key(f.key) and not is_eval_key(f.key) for f in fs)
    # A plural key is a setting unless a loss stands beside it (DeepSpeed's pipeline: `steps: 8 loss: 12.4`).
    named = [i for i in ok if (fs[i].key in _STEP_PREFERENCE and (has_loss or not _plural(fs[i].key)))
             or (fs[i].word in ("step", "iteration", "iter", "update", "batch") and fs[i].key.count(" ") <= 1)]
    # An n/total with no step word reads as a counter where loggers frame it so: `[659/742]`, `8/ 20 |`.
    counted = [i for i in ok if fs[i].total is not None and fs[i].word not in EPOCH_KEYS and fs[i].key not in EPOCH_KEYS
               and re.match(r"[ \t]*[]|]", line.text_after(fs[i]))]
    counter = min(named, key=lambda i: _STEP_PREFERENCE.get(fs[i].key, _STEP_PREFERENCE.get(fs[i].word, 99)), default=None)
    counter = counter if counter is not None else (counted[-1] if counted else None)
    rate, _ = _rate(fs)
    epoch = _epoch_field(fs)
    if alone and not ((counter is not None and _metric(fs)) or (has_loss and (rate is not None or epoch is not None))):
        return None
    return _step(line, counter, None)


def _plural(key: str) -> bool:
    return key.endswith("s") and key != "num_updates" and key != "s"


def _candidate(index: int, raw: str) -> _Line | None:
    text = clean(raw)
    if (len(text) > 2000 or not any(c.isdigit() for c in text) or _NOT_PROGRESS.search(text) or _IS_BAR.search(text)
            or is_setting(text)):
        return None
    fs = tuple(fields(text, MAX_FIELDS + 1))
    if not fs or len(fs) > MAX_FIELDS:
        return None
    has_counter = any(_counter(f) for f in fs) or _epoch_field(fs) is not None
    has_loss = any(is_loss_key(f.key) for f in fs)
    if not has_counter and not has_loss and not _leading_counter(fs) and not _rated_count(fs):
        return None
    return _Line(index, raw.strip(), template(text), fs, text)


def _leading(f: Field, i: int) -> bool:
    """The line's first number, where the line starts (`98:\tlearn: …`, `[500]\teval-…`, a bare table's first
    column) or after the one word that names it (TPOT's `Generation 20 - Current best internal CV score: 0.71`):
    the row's label — a loop's counter when it advances line after line."""
    named = bool(f.key) and " " not in f.key and f.start <= len(f.key) + 2
    return i == 0 and (f.start <= 1 or named) and f.is_int and f.finite and f.value >= 0


def _leading_counter(fs: Sequence[Field]) -> bool:
    """A line that may be a loop's report though it names no counter: its first number leads it and the rest
    measure something (a fraction, a loss, a time) — CatBoost's iterations, AWR's bare columns."""
    return bool(fs) and _leading(fs[0], 0) and len(fs) >= 2 and (_metric(fs) or any(not f.is_int and f.finite for f in fs[1:]))


def _pass_fraction(fs: Sequence[Field]) -> bool:
    """An evaluation line that says how far its pass got: an n/total that is not the epoch's own count (Catalyst's
    `2/4 * Epoch 2 (valid): … loss=1.4724` reports epoch 2 of 4's finished validation, not a pass at 50 %)."""
    epoch = _epoch_field(fs)
    return any(f.total is not None and f.is_int and not (epoch is not None and f is not epoch and f.value == epoch.value)
               for f in fs)


def _epoch_column(group: Sequence[_Line]) -> int | None:
    """Where an epoch field stands in these lines, when it advances from line to line."""
    width = min(len(line.fields) for line in group)
    for i in range(width):
        column = [line.fields[i] for line in group]
        if column[-1].word in EPOCH_KEYS and all(f.is_int for f in column) and _advancing([f.value for f in column]):
            return i
    return None


_PROGRESS_KEYS = ("", "at", "progress", "done", "completed", "complete")
PERCENT_LINES = 3


def _percent_column(group: Sequence[_Line]) -> int | None:
    """Where these lines say how far the loop is, in percent, when that figure advances line after line (gensim's
    `EPOCH 1 - PROGRESS: at 24.71% examples`, fastText's `{"progress":64.8,…}`); an accuracy in % is no such field."""
    if len(group) < PERCENT_LINES or not any(f.unit == "%" or f.key == "progress" for f in group[-1].fields):
        return None
    width = min(len(line.fields) for line in group)
    for i in range(width):
        column = [line.fields[i] for line in group]
        last = column[-1]
        if not ((last.unit == "%" and last.key in _PROGRESS_KEYS) or (last.key == "progress" and not last.unit)):
            continue
        values = [f.value for f in column]
        if all(f.key == last.key and 0 <= f.value <= 100 for f in column) and _advancing(values):
            return i
    return None


def _rated_count(fs: Sequence[Field]) -> bool:
    """A line that may be a loop's report though it names no counter: a throughput beside whole numbers, one of
    which may be the total done so far (Sample Factory's `Fps is (10 sec: 19622.1, …). Total num frames: 438272.`)."""
    return any(f.unit in RATE_UNITS or (f.key and _rate_unit_of_key(f.key)) for f in fs) and any(
        f.is_int and f.finite and f.value > 0 for f in fs)


def _named_nothing(fs: Sequence[Field]) -> bool:
    """A line that names neither a counter nor a loss (admitted by its leading number or a rate alone)."""
    return not any(_counter(f) for f in fs) and _epoch_field(fs) is None and not any(is_loss_key(f.key) for f in fs)


def _growing(group: Sequence[_Line]) -> bool:
    """Beside a throughput, a whole number that grows at every report is the total done: the loop's counter."""
    width = min(len(line.fields) for line in group)
    return len(group) >= 3 and _rated_count(group[-1].fields) and any(
        all(line.fields[i].is_int for line in group) and all(b.fields[i].value > a.fields[i].value for a, b in zip(group, group[1:]))
        for i in range(width))


def _steady(group: Sequence[_Line]) -> bool:
    """A leading number that counts a loop: it advances by the same stride line after line (a loop logs every
    N steps). A results table keyed by a parameter (`10-NN … 20-NN … 100-NN`) does not."""
    values = [line.fields[0].value for line in group]
    strides = {b - a for a, b in zip(values, values[1:])}
    return len(values) >= 3 and len(strides) == 1 and min(strides) > 0


def _advancing(values: Sequence[float]) -> bool:
    return len(values) >= 2 and all(b >= a for a, b in zip(values, values[1:])) and values[-1] > values[0]


def _advancing_per_epoch(values: Sequence[float], total: int | None) -> bool:
    """An n/total counter that restarts each epoch (fairseq's `| epoch 011  3000 / 8223`): it advances
    between its restarts, and never passes its total."""
    if total is None or max(values) > total:
        return False
    runs, current = [], [values[0]]
    for a, b in zip(values, values[1:]):
        if b < a:
            runs.append(current)
            current = []
        current.append(b)
    runs.append(current)
    return len(runs) > 1 and any(_advancing(r) for r in runs)


def _choose_counter(group: Sequence[_Line]) -> int | None:
    """Which field (by position in the template) is the loop's counter for this group of same-template lines."""
    width = min(len(line.fields) for line in group)
    scores = []
    for i in range(width):
        column = [line.fields[i] for line in group]
        f = column[-1]
        if not f.is_int or not f.finite or f.value < 0 or is_loss_key(f.key) or f.key in RATE_KEYS:
            continue
        values = [c.value for c in column]
        advances = _advancing(values) or _advancing_per_epoch(values, f.total)
        named = _named_as(f)
        is_epoch = f.word in EPOCH_KEYS or f.key in EPOCH_KEYS
        if len(group) >= 2 and not advances and not (named is not None and values[-1] >= values[0]):
            continue
        if len(group) == 1 and f.key not in _STEP_PREFERENCE and not _COMPOUND.match(f.key) and f.total is None and not is_epoch:
            continue  # alone, only an exact step key counts: "gradient accumulation steps 8" is a setting
        # Named step keys first — one that advances before one that stands (litgpt's `iter 62 step 1`: the
        # optimizer's step waits for gradient accumulation, the iteration counts) —, then an n/total counter that
        # moves, then an epoch, then anything advancing. A named key that stands comes after an n/total counter that
        # moves (`[049500/50000] … | batch 16` names its batch size), before a leading number that advances (Paddle's
        # `Epoch 149, Step 125`, whose step restarts each epoch).
        rank = ((0, named) if advances or len(group) < 2 else (1, 0.5, named)) if named is not None else (
            (1, 0) if f.total is not None else (1, 1) if advances and _leading(f, i) else (3, 0) if is_epoch else (2, 0))
        scores.append((rank, -i if advances else i, i))
    return min(scores)[2] if scores else None


def _loss(fs: Sequence[Field]) -> tuple[float | None, str | None]:
    losses = [f for f in fs if is_loss_key(f.key) and "scale" not in f.key]
    training = [f for f in losses if not is_eval_key(f.key)]
    pool = training or losses
    if not pool:
        ppl = next((f for f in fs if f.key.endswith("ppl") and not is_eval_key(f.key)), None)
        return (ppl.value, "ppl") if ppl else (None, None)
    best = next((f for f in pool if f.key in ("loss", "lm loss", "train_loss", "train/loss", "train loss")), pool[0])
    return best.value, best.key


def _rate_unit_of_key(key: str) -> str | None:
    """`tok/s`, `train/tokens_per_sec`, `RunningAvgSamplesPerSec`, `tokens per gpu per second (tgs)`."""
    if unit := RATE_KEYS.get(key) or RATE_UNITS.get(key):
        return unit
    squashed = re.sub(r"[^a-z0-9/]", "", key)
    squashed = re.sub(r"^(?:train|training|throughput|runningavg|curr|avg|mean)/?", "", squashed)
    return next((unit for pattern, unit in RATE_KEY_PATTERNS if pattern.search(squashed)), None)


def _rate(fs: Sequence[Field]) -> tuple[float | None, str | None]:
    """The line's most telling rate: tokens over samples over iterations (RATE_PREFERENCE)."""
    found: dict[str, float] = {}
    for f in fs:
        unit = RATE_UNITS.get(f.unit) or (_rate_unit_of_key(f.key) if f.key else None)
        if not unit or not f.finite or is_eval_key(f.key) or "curr" in f.key.replace(" ", ""):
            continue
        value = f.value
        if unit == "s/it":
            if not value:
                continue
            unit, value = "it/s", 1 / value
        found.setdefault(unit, value)
    unit = next((u for u in RATE_PREFERENCE if u in found), None)
    return (found[unit], unit) if unit else (None, None)


_ELAPSED_KEYS = ("elapsed", "elapsed_time", "elapsed_s", "elapsed time", "wall", "walltime", "train_time", "runtime")
_UNIT_SECONDS = {"ms": 0.001, "s": 1.0, "clock": 1.0, "": 1.0, "min": 60.0, "m": 60.0, "h": 3600.0}


def _elapsed(fs: Sequence[Field]) -> float | None:
    for f in fs:
        if f.key in _ELAPSED_KEYS and f.finite and f.value >= 0:
            return f.value * _UNIT_SECONDS.get(f.unit, 1.0)
    return None


def _step_time(fs: Sequence[Field]) -> float | None:
    for f in fs:
        scale = STEP_TIME_KEYS.get(f.key)
        if scale is not None and f.finite and f.value > 0:
            return f.value * (0.001 if f.unit == "ms" else scale)
    return None


def _step(line: _Line, counter: int | None, stamp: float | None) -> Step:
    fs = line.fields
    c = fs[counter] if counter is not None and counter < len(fs) else None
    epoch_field = _epoch_field(fs)
    loss, loss_key = _loss(fs)
    rate, unit = _rate(fs)
    counter_is_epoch = c is not None and epoch_field is not None and c.start == epoch_field.start
    total = c.total if c is not None else None
    if c is not None and total is None:  # NeMo: `iteration 10/999 | … | global_step: 10`: the same count, with its total
        total = next((f.total for f in fs if f.total is not None and f.value == c.value and f is not c), None)
    if c is not None and total is None and counter + 1 < len(fs):  # `step: 1050 (total: 1060)`, `step 5 of 100`
        after = fs[counter + 1]
        total = int(after.value) if after.key in _TOTAL_KEYS and after.is_int and after.value >= c.value else None
    return Step(
        line=line.text.strip(),
        step=int(c.value) if c is not None and not counter_is_epoch else None,
        total=total if not counter_is_epoch else None,
        loss=loss,
        rate=rate,
        rate_unit=unit,
        epoch=epoch_field.value if epoch_field is not None and epoch_field.finite else None,
        epoch_total=epoch_field.total if epoch_field is not None else None,
        counter=(c.key or c.word or ("batch" if c.total is not None else "step")) if c is not None else None,
        loss_key=loss_key,
        step_time=_step_time(fs),
        elapsed=_elapsed(fs),
        index=line.index,
        stamp=stamp,
        fmt="structure",
        non_finite=_non_finite(fs),
        lr=_lr(fs),
    )


_TOTAL_KEYS = ("total", "of")  # the key of a counter's total printed as a field of its own, right after it
_LR_KEY = re.compile(r"(?:^|[/_ -])(?:lr|learning[_ ]rate)(?:$|[/_ -])")


def _lr(fs: Sequence[Field]) -> float | None:
    return next((f.value for f in fs if f.finite and _LR_KEY.search(f.key) and not is_eval_key(f.key)), None)


def _non_finite(fs: Sequence[Field]) -> tuple[str, ...]:
    """The loss or gradient numbers that went nan/inf (a NaN learning-rate or a `nan` count is no finding)."""
    return tuple(f.key for f in fs if not f.finite and (is_loss_key(f.key) or "norm" in f.key or f.word in _LOSS_LIKE)
                 and not is_eval_key(f.key))


_ERROR_KEY = re.compile(r"(?:^|[ _])err(?:or)?s?$")  # an error rate: `validation error`, `val_err`


def _measured_non_finite(fs: Sequence[Field]) -> tuple[str, ...]:
    """An evaluation's losses and error rates that went nan/inf (Theano's `epoch 35: validation error nan %`)."""
    return tuple(f.key for f in fs if not f.finite and (is_loss_key(f.key) or _ERROR_KEY.search(f.key)))


# What a loop prints of its loss when it prints no `loss`: OpenNMT-py's `ppl:   nan; xent:  nan` (perplexity and
# cross-entropy of the training batches); nan there is the loss's nan.
_LOSS_LIKE = frozenset({"ppl", "perplexity", "xent"})


@dataclass(frozen=True)
class Progress:
    """What a window's progress lines say: the loop's latest series, and the latest evaluation pass's
    progress line (`Epoch(val)  [4][1/8]`, `dev step: 50/200`) — a counter with a total in an evaluation's
    template, which the loop's series never takes."""

    steps: tuple[Step, ...] = ()
    evaluation: Step | None = None
    loop: CounterRule | None = None  # the loop's template and which of its numbers counts
    sightings: tuple[Sighting, ...] = ()  # the window's most recent templates, newest first (bot.core.learned)


def recognise(lines: Sequence[str], stamps: Sequence[float | None] = (), earlier: Sequence[str] = ()) -> tuple[Step, ...]:
    """The run's latest progress series, oldest first (at most KEPT_STEPS).

    `lines` are the window's lines (index = position); `earlier` are progress-looking lines from further
    back (the probe's grep), used only when the window has none. Lines of one template form a series;
    the series whose last line comes latest and is not an evaluation is the loop's."""
    return read_progress(lines, stamps, earlier).steps


def read_progress(lines: Sequence[str], stamps: Sequence[float | None] = (), earlier: Sequence[str] = (),
                  rule: CounterRule | None = None) -> Progress:
    """`rule`: the counter earlier looks at this log learned (bot.core.learned): its template is the loop's
    even when the window holds one line of it, or its numbers have no names."""
    found = _series(list(enumerate(drop_mappings(fold_headed_tables(fold_tables(lines))))), stamps, rule)
    if not found.steps and earlier:
        back = _series([(-len(earlier) + i - 1, t) for i, t in enumerate(drop_mappings(fold_headed_tables(fold_tables(earlier))))], (), rule)
        found = replace(found, steps=back.steps, loop=back.loop)
    return found


# A key/value table printed whole at each report (stable-baselines3's logger: `| key | value |` rows between
# dashed lines, section rows such as `| time/ | |` with no value): each block is one report, so it is read as one
# line, `key: value | …`, at its closing rule; the recurring blocks then form a series like any other, and the
# field that advances (`total_timesteps`) is their counter.
_RULE = re.compile(r"^[ \t]*-{8,}[ \t]*$")
_KV_ROW = re.compile(r"^[ \t]*\|[ \t]*([^|]*?)[ \t]*\|[ \t]*([^|]*?)[ \t]*\|[ \t]*$")


def fold_tables(lines: Sequence[str]) -> Sequence[str]:
    """The lines with each key/value block folded into its closing rule's line (its rows left blank)."""
    if not any("|" in x and _RULE.match(y) for x, y in zip(lines, lines[1:])):
        return lines
    out, start = list(lines), None
    for i, text in enumerate(lines):
        if _RULE.match(text):
            rows = [_KV_ROW.match(x) for x in lines[start + 1:i]] if start is not None else []
            if len(rows) >= 2 and all(rows):
                cells = [f"{m[1].rsplit('/', 1)[-1]}: {m[2]}" for m in rows if m[2]]
                out[start:i] = [""] * (i - start)
                out[i] = " | ".join(cells)
                start = None
            else:
                start = i
        elif start is not None and not _KV_ROW.match(text):
            start = None
    return out


# A table with a header row (Ray Tune's trial status, a markdown table): `| Trial name | status | … | iter | ts |`, a rule
# `|---+---|`, then one row per item. Each row is read as the header's names beside its own cells (`iter: 325 | ts:
# 1071840`), so a counter that only the header names is found like any named field.
_SEPARATOR = re.compile(r"^[ \t]*[|+][-=:+| ]*-[-=:+| ]*$")
_CELLS = re.compile(r"^[ \t]*\|(.*)\|[ \t]*$")


def _cells(text: str) -> list[str] | None:
    m = _CELLS.match(text)
    return [c.strip() for c in m[1].split("|")] if m else None


# A plain table's rule: a dash run under each column, two spaces or more between them (skorch's epoch table,
# tabulate's "simple" format): `-------  -------  ------  ------------`.
_PLAIN_RULE = re.compile(r"^[ \t]*-{2,}(?:[ \t]{2,}-{2,}){2,}[ \t]*$")


def _plain_cells(text: str, spans: Sequence[tuple[int, int]]) -> list[str] | None:
    """A plain table's row cut into its columns: each word in the column whose rule it overlaps (a cell may be empty:
    skorch's `cp` holds `+` or nothing); None when a word lies under no column (no row of this table)."""
    cells = [""] * len(spans)
    for m in re.finditer(r"\S+", text):
        k = next((k for k, (a, b) in enumerate(spans) if m.start() < b and m.end() > a), None)
        if k is None:
            return None
        cells[k] = f"{cells[k]} {m[0]}".strip()
    return cells


def fold_headed_tables(lines: Sequence[str]) -> Sequence[str]:
    """The lines with each row of a headed table read as `name: cell | …` (its header and rules left blank)."""
    out = None
    for i in range(1, len(lines) - 1):
        if _PLAIN_RULE.match(lines[i]):
            spans = [m.span() for m in re.finditer(r"-{2,}", lines[i])]
            cut = lambda text, spans=spans: _plain_cells(text, spans)  # noqa: E731
        elif _SEPARATOR.match(lines[i]) and "|" in lines[i - 1]:
            cut = _cells
        else:
            continue
        header = cut(lines[i - 1])
        if not header or len(header) < 3 or sum(bool(re.search(r"[A-Za-z]", h)) for h in header) < len(header) - 1:
            continue
        rows = []
        for k in range(i + 1, len(lines)):
            cells = cut(lines[k])
            if cells is None or len(cells) != len(header) or not any(c[:1].isdigit() for c in cells):
                break
            rows.append((k, cells))
        if not rows:
            continue
        out = list(lines) if out is None else out
        out[i - 1] = out[i] = ""
        for k, cells in rows:
            out[k] = " | ".join(f"{h}: {c}" for h, c in zip(header, cells) if h and c)
    return lines if out is None else out


# A configuration printed as YAML (yacs' `Running with config:`, Hydra's dump): indented `KEY: value` lines, one
# word a key, in a block (blank lines and comments within it) with words among its values. Its numbers are settings (`CENTER_LOSS_WEIGHT: 0.0005`).
_MAPPING_ROW = re.compile(r"^[ \t]+[A-Za-z_][\w.-]*:[ \t]+(\S.*)$")
MAPPING_ROWS = 3
# Inside a dump, what joins its rows: `  ROI_HEADS:` (a section), `    - p5` (a list's item), `VERSION: 2` (top level).
_MAPPING_GLUE = re.compile(r"^[ \t]*[A-Za-z_][\w.-]*:[ \t]*$|^[ \t]*- \S|^[A-Z_][A-Z0-9_.-]*:[ \t]+\S")
_NUMBERS_ONLY = re.compile(r"[-+\d.eE,\[\] ]+$")  # a value that is numbers alone (`[256, 128]`, `0.5`)


def drop_mappings(lines: Sequence[str]) -> Sequence[str]:
    """The lines with each YAML mapping block blanked (its rows are settings, never progress)."""
    out, run, glue, glued = None, [], [], set()
    for i, text in enumerate([*lines, ""]):
        if m := _MAPPING_ROW.match(text):
            run.append((i, m[1]))
            continue
        if run and i < len(lines) and (not text.strip() or text.lstrip().startswith("#")):
            continue  # a blank line or a comment inside the block
        if run and i < len(lines) and _MAPPING_GLUE.match(text) and text not in glued:
            # a section's own key, a list's item, a top-level key: the same dump (detectron2's). One that recurs is
            # a template's heading (DeepTCR's `Training_Statistics:` over each epoch's line), not a dump's key.
            glue.append(i)
            glued.add(text)
            continue
        if len(run) >= MAPPING_ROWS and any(not _NUMBERS_ONLY.match(value) for _, value in run):
            out = list(lines) if out is None else out
            for k in [k for k, _ in run] + glue:
                out[k] = ""
        run, glue, glued = [], [], set()
    return lines if out is None else out


# Lines templated at first, the newest with digits in them: a 64 KiB window of step lines holds some 1500,
# and templating them all was most of a probe's CPU. Only when these hold no loop (rank 0) are all read.
RECENT_LINES = 400
_DIGIT = re.compile(r"\d")


@dataclass(frozen=True)
class _Found:
    rank: int
    group: list[_Line] | None  # the loop's series; None: no loop among the lines
    counter: int | None
    groups: dict
    evaluation: _Line | None  # the latest evaluation line with an n/total counter
    sightings: tuple[Sighting, ...] = ()
    paired: tuple[list[_Line], int | None] | None = None  # the series printed with the loop's that measures its loss
    percent: int | None = None  # the field of the loop's lines that says how far it is, in percent


def _series(numbered: Sequence[tuple[int, str]], stamps: Sequence[float | None], rule: CounterRule | None = None) -> Progress:
    with_digits = [(i, t) for i, t in numbered if _DIGIT.search(t)]
    found = _latest(with_digits[-RECENT_LINES:], rule)
    if len(with_digits) > RECENT_LINES and (found.group is None or found.rank > 0):
        found = _latest(with_digits, rule)
    evaluation = None
    if (line := found.evaluation) is not None:
        counter = max(i for i, f in enumerate(line.fields) if f.total is not None)
        evaluation = _step(line, counter, _stamp(stamps, line.index))
    if found.group is None:
        return Progress((), evaluation, sightings=found.sightings)
    kept = found.group[-KEPT_STEPS:]
    steps = tuple(_step(line, found.counter, _stamp(stamps, line.index)) for line in kept)
    if _evaluation(found.group[-1].template, found.group[-1].fields):
        # A loop that reports only its validation: a NaN there is the run's, the only loss it shows.
        steps = tuple(replace(s, non_finite=s.non_finite or _measured_non_finite(line.fields)) for s, line in zip(steps, kept))
    if found.paired is not None:
        steps = _with_measures(steps, *found.paired)
    if found.percent is not None:
        steps = tuple(replace(s, percent=line.fields[found.percent].value) for s, line in zip(steps, kept))
    if steps[-1].step is None:
        steps = _borrow_counter(steps, found.groups)
    loop = CounterRule(found.group[-1].template[:MAX_TEMPLATE], found.counter) if found.counter is not None else None
    return Progress(steps, evaluation, loop, found.sightings)


def _with_measures(steps: tuple[Step, ...], paired: Sequence[_Line], counter: int | None) -> tuple[Step, ...]:
    """Each step with the loss of the paired series' line printed with it: the one that counts the same (xgboost's
    `boosting round 45` then `[45] …`), else the nearest before or after it."""
    out = []
    for step in steps:
        near = [line for line in paired if abs(line.index - step.index) <= PAIRED_WITHIN]
        if not near:
            out.append(step)
            continue
        same = [line for line in near if counter is not None and counter < len(line.fields)
                and line.fields[counter].value in (step.step, step.epoch)]
        measured = _step(same[0] if same else min(near, key=lambda line: abs(line.index - step.index)), counter, None)
        out.append(replace(step, loss=measured.loss, loss_key=measured.loss_key,
                           non_finite=step.non_finite or measured.non_finite))
    return tuple(out)


def _sighting(tpl: str, raw: str) -> Sighting | None:
    """A template's newest line as the next look will compare it: its numbers, and which could count a loop."""
    text = clean(raw)
    if _NOT_PROGRESS.search(text) or _IS_BAR.search(text):
        return None
    fs = fields(text, MAX_FIELDS + 1)
    return _sighted(tpl, fs) if fs and len(fs) <= MAX_FIELDS and not _evaluation(tpl, fs) else None


def _sighted(tpl: str, fs: Sequence[Field]) -> Sighting:
    countable = tuple(i for i, f in enumerate(fs) if f.is_int and f.finite and f.value >= 0 and not is_loss_key(f.key)
                      and f.key not in RATE_KEYS and f.unit not in RATE_UNITS and f.unit != "clock"
                      and f.key not in STEP_TIME_KEYS and f.key not in _ELAPSED_KEYS)
    measured = _metric(fs) or any(not f.is_int and f.finite for f in fs)
    return Sighting(tpl[:MAX_TEMPLATE], tuple(f.value if f.finite else 0.0 for f in fs), countable, measured)


def _sightings(by_template: dict[str, list[tuple[int, str]]], loop: _Line | None) -> tuple[Sighting, ...]:
    """What the next look compares: a window with a loop, only its line (already read: no cost); one without, its
    most recent templates, any of which may be a loop that one window cannot show."""
    if loop is not None:
        return (_sighted(loop.template[:MAX_TEMPLATE], loop.fields),)
    recent = sorted(by_template.items(), key=lambda kv: kv[1][-1][0], reverse=True)[:MAX_SIGHTINGS]
    return tuple(s for tpl, items in recent if (s := _sighting(tpl, items[-1][1])) is not None)


def _ruled(rule: CounterRule, items: Sequence[tuple[int, str]]) -> list[_Line]:
    """The lines of a learned loop's template, read whatever their numbers are called."""
    out = []
    for index, raw in items[-READ_PER_TEMPLATE:]:
        text = clean(raw)
        fs = tuple(fields(text, MAX_FIELDS + 1))
        if rule.field < len(fs) <= MAX_FIELDS and fs[rule.field].is_int and not _IS_BAR.search(text):
            out.append(_Line(index, raw.strip(), rule.template, fs, text))
    return out


def _latest(numbered: Sequence[tuple[int, str]], rule: CounterRule | None = None) -> _Found:
    """The latest best-ranked series among these lines, and the latest evaluation line with a total."""
    # Lines grouped by template first (cheap), and only each template's last lines read field by field:
    # the latest series is what counts.
    by_template: dict[str, list[tuple[int, str]]] = defaultdict(list)
    for index, text in numbered:
        by_template[template(clean(text))].append((index, text))
    groups: dict[str, list[_Line]] = defaultdict(list)
    for tpl, items in by_template.items():
        if rule is not None and tpl[:MAX_TEMPLATE] == rule.template:
            if ruled := _ruled(rule, items):
                groups[tpl] = ruled
            continue
        for index, text in items[-READ_PER_TEMPLATE:]:
            if (c := _candidate(index, text)) is not None and not END_METRICS.search(text):
                groups[c.template].append(c)
    # A template that recurs with a counter is a loop; one line alone, or lines with a loss but no counter (HF's
    # dicts), only when nothing better is there.
    ranked: list[_Series] = []
    evaluation: _Line | None = None
    by_epoch: list[_Series] = []  # evaluation series counted by an advancing epoch
    for tpl, group in groups.items():
        if _evaluation(tpl, group[-1].fields):
            last = group[-1]
            if _pass_fraction(last.fields) and (evaluation is None or last.index > evaluation.index):
                evaluation = last
            if (epoch := _epoch_column(group)) is not None:
                by_epoch.append(_Series(2, group, epoch))
            continue
        if rule is not None and tpl[:MAX_TEMPLATE] == rule.template:
            # Learned at earlier looks: the number that advanced between them counts, one line is enough.
            ranked.append(_Series(0, group, rule.field))
            continue
        if _named_nothing(group[-1].fields) and not _steady(group) and not _growing(group):
            continue  # numbers in rows, no loop behind them
        counter = _choose_counter(group)
        has_loss = any(is_loss_key(f.key) for f in group[-1].fields)
        done = _percent_column(group)
        if counter is None and done is None and not (has_loss and (len(group) >= 2 or _metric(group[-1].fields))):
            continue  # numbers, but no loop behind them
        header = counter is not None and len(group) == 1 and _heads_block(group[0], numbered)
        if counter is not None and len(group) == 1 and not _metric(group[0].fields) and not header:
            continue  # one `step 3` in prose is not a loop
        rank = 0 if (counter is not None or done is not None) and len(group) >= 2 else (
            1 if counter is not None and (has_loss or header) else 2)
        ranked.append(_Series(rank, group, counter, done))
    # A loop that reports only its validation, epoch by epoch (Theano's `epoch 35: validation error nan %`): with
    # no training series, that epoch is the loop's.
    ranked = ranked or by_epoch
    if not ranked:
        return _Found(3, None, None, groups, evaluation, _sightings(by_template, None))
    best_rank = min(r.rank for r in ranked)
    # The latest loop; a lesser series only when it comes later and no loop does (a summary after
    # the loop is not the loop).
    best = [r for r in ranked if r.rank == best_rank]
    top = max(best, key=lambda r: r.last)
    # Two series printed together, line after line, the latest without the loss (xgboost's `[50]\ttrain-logloss:-nan…`
    # then `boosting round 51, 104 sec elapsed`; fairseq's epoch summary then `begin training epoch 104`): the
    # latest says where the loop is, the other what it measured.
    paired = None if _measures_loss(top.group) else max(
        (r for r in best if r is not top and r.last >= top.last - PAIRED_WITHIN and _measures_loss(r.group)),
        key=lambda r: r.last, default=None)
    return _Found(top.rank, top.group, top.counter, groups, evaluation,
                  _sightings(by_template, top.group[-1] if top.rank == 0 else None),
                  paired=(paired.group, paired.counter) if paired else None, percent=top.percent)


class _Series(NamedTuple):
    """A template's lines as a candidate for the loop: how well they rank (0: a loop), and which fields count."""

    rank: int
    group: list[_Line]
    counter: int | None
    percent: int | None = None  # the field that says how far the loop is, in percent

    @property
    def last(self) -> int:
        return self.group[-1].index


PAIRED_WITHIN = 2  # lines: a series whose last line is this close to the latest one's is printed with it


def _measures_loss(group: Sequence[_Line]) -> bool:
    return any(is_loss_key(f.key) and not is_eval_key(f.key) for f in group[-1].fields)


BLOCK_LINES = 40  # a report block's lines below its header: rsl_rl prints ~30 `name: value` lines an iteration


_KEY_VALUE = re.compile(r"[a-z][\w.]*:[ \t]*\d+")


def _heads_block(line: _Line, numbered: Sequence[tuple[int, str]]) -> bool:
    """The counter of a report block: a line that is only a counter out of a total (rsl_rl's centred
    `Learning iteration 156025/10000000`), with the block's measurements in the lines below it — a loss; or a
    `name: value` row of a block of such rows that measures a loss around it (RLlib's result, printed as YAML
    with its `training_iteration: 27` near the end)."""
    fs = line.fields
    if len(fs) != 1 or not fs[0].key or (fs[0].total is not None and fs[0].value > fs[0].total):
        return False
    row = fs[0].total is None
    if row and not _KEY_VALUE.fullmatch(line.cleaned):
        return False
    near = [text for index, text in numbered
            if line.index < index <= line.index + BLOCK_LINES or (row and line.index - BLOCK_LINES <= index < line.index)]
    return any(is_loss_key(f.key) for text in near for f in fields(clean(text)) if f.finite)


def _borrow_counter(steps: tuple[Step, ...], groups) -> tuple[Step, ...]:
    """A series with no counter of its own (loss dicts) takes the step number printed nearest it
    (TRL's `[step 720] best of last batch`, DeepSpeed's `step=2350, skipped=21`)."""
    last = steps[-1]
    near = [line for group in groups.values() for line in group if abs(line.index - last.index) <= 40]
    best = None
    for line in near:
        for f in line.fields:
            if f.is_int and f.finite and _named_as(f) is not None and not _plural(f.key):
                if best is None or abs(line.index - last.index) < abs(best[0].index - last.index):
                    best = (line, f)
    if best is None:
        return steps
    return (*steps[:-1], replace(last, step=int(best[1].value), total=best[1].total, counter=best[1].key))


def _evaluation(tpl: str, fs: Sequence[Field]) -> bool:
    """An evaluation pass's line: it names an evaluation, other than as what one of its rates times (rl_games'
    `fps step and policy inference: 349520.9` is a training loop's throughput) and without training figures beside."""
    if not is_eval_template(tpl) or _train_words(tpl):
        return False
    for key in sorted({f.key for f in fs if f.key and (f.unit in RATE_UNITS or _rate_unit_of_key(f.key))}, key=len, reverse=True):
        tpl = re.sub(r"[ \t]+".join(map(re.escape, key.split())), " ", tpl, flags=re.I)
    return is_eval_template(tpl)


def _train_words(tpl: str) -> bool:
    """The line reports training too, beside its evaluation (XGBoost's `train-logloss`, CatBoost's `learn:`)."""
    return bool(re.search(r"(?i)\b(?:train(?:ing)?|learn)\b(?! *(?:set|split|data))", tpl))


def _stamp(stamps: Sequence[float | None], index: int) -> float | None:
    return stamps[index] if 0 <= index < len(stamps) else None


def finite(value: float | None) -> bool:
    return value is not None and math.isfinite(value)


def bar_step(bar: Bar, index: int = -1) -> Step:
    """A training bar's frame as progress: n of total (per epoch for Lightning's `Epoch N:` bars), the rate
    it shows, and the loss in its postfix or description (`loss=2.3`, torchtune's `1|100|Loss: 2.345:`)."""
    fs = [f for f in fields(f"{bar.desc} {bar.postfix}") if f.key != "v_num"]
    loss, loss_key = _loss(fs)
    rate, unit = _rate(fields(bar.rate or "")) if bar.rate else (None, None)
    step = Step(line=bar.frame, step=bar.n, total=bar.total, loss=loss, rate=rate, rate_unit=unit,
                epoch=float(bar.epoch) if bar.epoch is not None else None, epoch_total=bar.epoch_total,
                counter="batch" if bar.epoch is not None else "step",
                loss_key=loss_key, index=index, fmt="bar", non_finite=_non_finite(fs))
    overall = _postfix_counter(fields(bar.postfix))
    return replace(step, step=int(overall.value), total=overall.total, counter=overall.key) if overall and overall.value > bar.n else step


def _postfix_counter(fs: Sequence[Field]) -> Field | None:
    """A step counter in a bar's postfix, past the bar's own count: the run's overall counter, which goes on
    where the bar restarts each epoch (Tianshou's `Epoch #5: 50001it [00:40, …, env_step=250000, …]`)."""
    return next((f for f in fs if f.is_int and f.finite and not is_loss_key(f.key)
                 and (f.word in ("step", "global_step", "iteration", "iter") or f.word.endswith("_step"))), None)


def counter_word(counter: str) -> str:
    """The word a counter goes by in the log's text (`global step` → `step`, `train/iter` → `iter`): a word that
    starts with it names it too (`iter` → `iteration`), as announcements and headers say it."""
    return counter.split()[-1].split("/")[-1].lower()


def announced_at(step: Step, text: str, number: int | None) -> Step:
    """The loop's place as an announcement names it, where that is later than its last progress line: a loop
    that logs every 10th iteration counting from 0 and saves at the 1000th prints `iter 990` and then `saving
    checkpoint at iteration 1000` — it stands at 1000. Only a number printed after the loop's own counter word
    (or HF's `checkpoint-1000`, which is the global step) counts, and never one past the loop's total."""
    if step.step is None or step.counter is None:
        return step
    word = re.escape(counter_word(step.counter))
    if number is None:  # the announcement names no step of its own: the loop's counter word may (SSD's `Saving state, iter: 14000`)
        found = re.findall(rf"(?i)\b{word}\w*[ \t_=:#-]*0*(\d{{1,12}})\b", text)
        number = int(found[-1]) if found else None
    if number is None or number <= step.step or (step.total and number > step.total):
        return step
    names = re.search(rf"(?i)\b{word}\w*[ \t_=:#-]*0*{number}\b", text) or (
        step.counter in ("step", "global_step", "global step") and re.search(rf"checkpoint[-_]0*{number}\b", text))
    return replace(step, step=number) if names else step


def final_count(lines: Sequence[str], step: Step) -> Step:
    """The loop's counter as a finished run last printed it: a summary after the loop may name a later
    step than the last progress line (`step=126 | loss=0.087` after `step=120 | loss=… | lr=…`)."""
    if step.counter is None or step.step is None or step.index < 0:
        return step
    best = step.step
    for text in lines[step.index + 1:]:
        for f in fields(text):
            if f.key == step.counter and f.is_int and f.finite and best < f.value and (step.total is None or f.value <= step.total):
                best = int(f.value)
    return replace(step, step=best) if best != step.step else step


# A table's header row: column names only, one of them the epoch (YOLOv5/v8, ultralytics:
# `Epoch    GPU_mem   box_loss   cls_loss   dfl_loss  Instances       Size`).
_HEADER_ROW = re.compile(r"^[ \t]*Epoch(?:[ \t]+[A-Za-z][\w()@.%/-]*){2,}[ \t]*$")


def table_header(line: str) -> list[str] | None:
    return line.split() if _HEADER_ROW.match(line) else None


def table_step(bar: Bar, header: Sequence[str], index: int) -> Step | None:
    """A bar whose description is a row under a header (`72/1000  6.73G  1.096 …  640: 100%|…| 16/16`): the
    epoch of epochs from its first column, the loss from the first loss column, the batch from the bar."""
    cells = bar.desc.split()
    if len(cells) != len(header) or not (m := re.fullmatch(r"(\d+)/(\d+)", cells[0])):
        return None
    losses = [c for h, c in zip(header, cells) if "loss" in h.lower()] or [c for h, c in zip(header, cells) if h.lower() == "box"]
    loss = number(losses[0]) if losses else None
    rate, unit = _rate(fields(bar.rate or "")) if bar.rate else (None, None)
    return Step(line=bar.frame, step=bar.n, total=bar.total, loss=loss, rate=rate, rate_unit=unit, epoch=float(m[1]),
                epoch_total=int(m[2]), counter="batch", loss_key="loss" if loss is not None else None, index=index,
                fmt="bar")

