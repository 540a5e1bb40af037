"""Pure: recognisers for step lines (every common trainer's format) and tqdm progress bars."""

from __future__ import annotations

import re

from bot.core.facts import Bar, Step
from bot.core.logtext import parse_int, split_rank_prefix
from bot.core.redact import strip_ansi  # pure too; one ANSI grammar for the whole bot

# Separators are [ \t], never \s: step_grep_ere mirrors these patterns in POSIX ERE, which has
# no \s, and Python's \s also matches Unicode spaces grep would not.
_NUM = r"[-+]?(?:(?:\d{1,3}(?:,\d{3})+(?!\d)|\d+)(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?|[-+]?(?i:nan|inf)(?![A-Za-z])"
_TOTAL = r"[ \t]*/[ \t]*(?P<{}>\d+(?:,\d{{3}})*)"
_RATE_UNIT = (r"(?i:tok(?:en)?s?/s(?:ec(?:ond)?)?|it/s|s/it|steps?/s|samples?/s(?:ec)?|ex(?:amples)?/s|"
              r"img/s|images/s|seqs?/s)")
# key=value / key: value anywhere; `step 10`, `loss 2.3` for a few well-known keys; `41.3k tok/s`.
_PAIR = re.compile(
    rf"(?<![A-Za-z0-9_])(?P<k>[A-Za-z][A-Za-z0-9_./-]{{0,40}})[ \t]*[=:][ \t]*\[?"
    rf"(?P<v>{_NUM})(?:{_TOTAL.format('t')})?(?P<u>[A-Za-z%]*)"
    rf"|(?<![A-Za-z0-9_])(?P<wk>(?i:step|iter|iteration|epoch|loss|lr))[ \t]+\[?(?P<wv>{_NUM})(?:{_TOTAL.format('wt')})?"
    rf"|(?<![\w.])(?P<rv>{_NUM})[ \t]?(?P<rm>[kKMG])?[ \t]*(?P<ru>{_RATE_UNIT})(?![A-Za-z])(?![ \t]*[=:])"
)
# In order of preference; `steps` (DeepSpeed's pipeline engine) is plural like prose ("warmup
# steps: 100"), so it only counts beside a loss. `num_updates` is fairseq's step.
_STEP_KEYS = ("globalstep", "trainer/globalstep", "train/globalstep", "step", "iteration", "iter", "numupdates", "steps")
_RATE_KEYS = (  # (normalised key pattern, unit); a leading "s/…" key is a duration, inverted
    (re.compile(r"(?:tok|token)s?(?:/s(?:ec(?:ond)?)?|pers(?:ec(?:ond)?)?)(?:/?(?:per)?(?:gpu|device))?$|^(?:tps|wps|tgs)$"),
     "tok/s"),
    (re.compile(r"(?:sample|samples|ex|example|examples|seq|seqs|sequences)(?:/s(?:ec(?:ond)?)?|pers(?:ec(?:ond)?)?)$"),
     "samples/s"),
    (re.compile(r"^(?:train)?(?:it|iter|iters|step|steps)(?:/s(?:ec)?|pers(?:ec(?:ond)?)?)$"), "it/s"),
    (re.compile(r"^(?:img|imgs|images)(?:/s|pers(?:ec)?)$"), "img/s"),
    (re.compile(r"^(?:s|sec)/it$"), "s/it"),
)
_METRIC = re.compile(r"loss|norm|mfu|flops|ppl|perplexity|time|^dt$|^mem|memory|acc|^lr$|learningrate")
_ELAPSED = re.compile(
    r"(?i)(?<![A-Za-z0-9_])elapsed(?:_?time)?(?:_s)?[ \t]*[=:][ \t]*(?:(\d+):(\d\d)(?::(\d\d(?:\.\d+)?))?"
    r"|(\d+(?:\.\d+)?)[ \t]?(ms|s|secs?|seconds|m|mins?|minutes|h|hrs?|hours)?)(?![A-Za-z])"
)
_UNIT_S = {"ms": 0.001, "m": 60, "min": 60, "mins": 60, "minutes": 60, "h": 3600, "hr": 3600, "hrs": 3600, "hours": 3600}
_SCALE = {"k": 1e3, "K": 1e3, "M": 1e6, "G": 1e9}
def _float(s: str) -> float:
    return float(s.replace(",", ""))


def _norm(key: str) -> str:
    return re.sub(r"[^a-z0-9/]", "", key.lower())


def _rate(key: str, value: float) -> tuple[float, str] | None:
    for pattern, unit in _RATE_KEYS:
        if pattern.search(key):
            if unit != "s/it":
                return value, unit
            return (1 / value, "it/s") if value else None  # tqdm's slow form, 2.5s/it
    return None


def _pick_loss(found: dict[str, float]) -> float | None:
    """Training loss over evaluation loss: `loss` > `train_loss`… > any *loss > val/eval/test loss."""
    losses = [k for k in found if "loss" in k and "scale" not in k]
    training = [k for k in losses if not k.startswith(("val", "eval", "test"))]
    for pool in (["loss", "trainloss", "train/loss", "lmloss"], training, losses):
        for key in pool:
            if key in found:
                return found[key]
    return None


def _generic(text: str) -> dict:
    """Every step/loss/rate/epoch/elapsed number the key=value extractor finds, plus `metric`."""
    steps: dict[str, tuple[int, int | None]] = {}
    found: dict[str, float] = {}
    out: dict = {"metric": False, "step_key": None}
    for m in _PAIR.finditer(text):
        if m["rv"] is not None:  # 41.3k tok/s
            value = _float(m["rv"]) * _SCALE.get(m["rm"] or "", 1)
            out.setdefault("rate", _rate(_norm(m["ru"]), value))
            continue
        key, raw, total = (m["k"], m["v"], m["t"]) if m["k"] else (m["wk"], m["wv"], m["wt"])
        key, unit = _norm(key), m["u"] or ""
        if key in _STEP_KEYS and parse_int(raw) is not None:
            steps.setdefault(key, (parse_int(raw), parse_int(total)))
            continue
        value = _float(raw) * _SCALE.get(unit, 1)
        found.setdefault(key, value)
        if key == "epoch":
            out.setdefault("epoch", value)
        elif (r := _rate(key, value)) is not None:
            out.setdefault("rate", r)
        out["metric"] |= bool(_METRIC.search(key))
    for key in _STEP_KEYS:
        if key in steps:
            out["step"], out["total"] = steps[key]
            out["step_key"] = key
            break
    out["loss"] = _pick_loss(found)
    if m := _ELAPSED.search(text):
        h_or_m, s_or_m, s, num, unit = m.groups()
        if num is not None:
            out["elapsed"] = float(num) * _UNIT_S.get((unit or "s").lower(), 1)
        else:  # mm:ss or hh:mm:ss
            out["elapsed"] = int(h_or_m) * 3600 + int(s_or_m) * 60 + float(s) if s else int(h_or_m) * 60 + int(s_or_m)
    rate = out.pop("rate", None)
    out["rate"], out["rate_unit"] = rate if rate else (None, None)
    out["metric"] |= out["loss"] is not None or rate is not None or "elapsed" in out
    return out


def _fields(found: dict) -> dict:
    keys = ("step", "total", "loss", "rate", "rate_unit", "epoch", "elapsed")
    return {k: found[k] for k in keys if found.get(k) is not None}


_CODE_CALL = re.compile(r"(?<![\w.])[A-Za-z_][\w.]{0,80}\([^()]*\b(?:step|iter|global_step)[ \t]*=")
_NOT_KV = re.compile(r'^[ \t]*(?:File "|Traceback|During handling|The above exception)'
                     r"|^[\w.]*(?:Error|Exception|Warning)\b:")


def _kv(text: str) -> dict | None:
    if _NOT_KV.search(text) or _CODE_CALL.search(text) or _match_bar(text):
        return None  # traceback frames, code quoted in them, progress bars
    g = _generic(text)
    if g.get("step") is not None and g["metric"] and (g["loss"] is not None or g["step_key"] != "steps"):
        return _fields(g)
    if g["loss"] is not None and g["rate"] is not None:
        return _fields(g)
    return None


_MEGATRON = re.compile(r"(?i)(?:\biteration[ \t]+(\d+)[ \t]*(?:/[ \t]*(\d+))?"
                       r"|validation loss at iteration[ \t]+(\d+)[^|]*)[ \t]*\|(.*)")
_MEGATRON_RATES = (("tokens per second", "tok/s"), ("tokens/sec", "tok/s"), ("tgs", "tok/s/GPU"),
                   ("samples per second", "samples/s"), ("tflop/s/gpu", "TFLOP/s/GPU"), ("throughput", None))


def _megatron(text: str) -> dict | None:
    if not (m := _MEGATRON.search(text)):
        return None
    fields = {}
    for part in m[4].split("|"):
        key, _, value = part.partition(":")
        if v := re.search(_NUM, value):
            fields[key.strip().lower()] = _float(v[0])
    out = {"step": parse_int(m[1] or m[3]), "total": parse_int(m[2])}
    loss_keys = [k for k in fields if "loss" in k and "scale" not in k and "ppl" not in k]
    if loss_keys:
        out["loss"] = fields.get("lm loss", fields.get("lm loss value", fields[loss_keys[0]]))
    for needle, unit in _MEGATRON_RATES:
        if key := next((k for k in fields if needle in k), None):
            out["rate"], out["rate_unit"] = fields[key], unit
            break
    return out


_TITAN = re.compile(rf"(?i)\bstep:[ \t]*(\d+)[ \t]+loss:[ \t]*({_NUM})(.*)")
_TITAN_MARK = re.compile(r"(?i)\b(?:memory|tps|wps|tflops|mfu|grad_norm):")


def _torchtitan(text: str) -> dict | None:
    if not (m := _TITAN.search(text)) or not _TITAN_MARK.search(m[3]):
        return None
    out = {"step": parse_int(m[1]), "loss": _float(m[2])}
    if r := re.search(r"(?i)\b[tw]ps:[ \t]*(\d[\d,]*(?:\.\d+)?)", m[3]):
        out["rate"], out["rate_unit"] = _float(r[1]), "tok/s"
    return out


_NANO = re.compile(rf"(?i)\biter[ \t]+(\d+):[ \t]*loss[ \t]+({_NUM})"  # training
                   rf"|\bstep[ \t]+(\d+):[ \t]*train loss[ \t]+({_NUM}),[ \t]*val loss")  # evaluation


def _nanogpt(text: str) -> dict | None:
    if not (m := _NANO.search(text)):
        return None
    return {"step": parse_int(m[1] or m[3]), "loss": _float(m[2] or m[4])}


_HF_PAIR = re.compile(rf"""['"](?P<k>[A-Za-z0-9_/.-]{{1,80}})['"][ \t]*:[ \t]*(?P<q>['"]?)(?P<v>{_NUM})(?P=q)""")


def _hf(text: str) -> dict | None:
    if "{" not in text:
        return None
    found: dict[str, float] = {}
    for m in _HF_PAIR.finditer(text):
        found.setdefault(m["k"].lower(), _float(m["v"]))
    if not any("loss" in k for k in found):
        return None
    out = {"loss": _pick_loss({_norm(k): v for k, v in found.items()}), "epoch": found.get("epoch")}
    step = next((found[k] for k in ("step", "global_step", "train/global_step") if k in found), None)
    out["step"] = int(step) if step is not None and step.is_integer() and 0 <= step < 1e18 else None
    for key, value in found.items():
        if not key.startswith(("eval", "test")) and (r := _rate(_norm(key), value)):
            out["rate"], out["rate_unit"] = r
            break
    out["elapsed"] = found.get("train_runtime")
    return out


_RICH_EPOCH = re.compile(  # `Epoch 3/9  ━━━╸━━ 450/1000 0:00:30 • 0:00:37 14.80it/s v_num: 0 train_loss: 0.123`
    rf"^Epoch[ \t]+(\d+)(?:/\d+)?[ \t]+[━╸╺╾╼─ -]*[ \t](\d+)/(\d+)[ \t]+\S+[ \t]*•[ \t]*\S+[ \t]*"
    rf"(?:({_NUM})it/s)?(.*)$")
_EPOCH_DESC = re.compile(r"^Epoch[ \t]*(\d+)")
_EVAL_DESC = re.compile(r"(?i)val|eval|test|sanity|predict|load|download|fetch|map|shard")
_POSTFIX_LOSS = re.compile(rf"(?i)(?<![A-Za-z0-9_])([A-Za-z0-9_/.-]{{0,40}}loss[A-Za-z0-9_/.-]{{0,40}})[=:][ \t]*({_NUM})")


def _lightning(text: str) -> dict | None:
    """Lightning's training bar (tqdm or rich), or any tqdm bar that carries a loss postfix."""
    if m := _RICH_EPOCH.match(text):
        losses = {_norm(k): _float(v) for k, v in _POSTFIX_LOSS.findall(m[5])}
        return {"step": parse_int(m[2]), "total": parse_int(m[3]), "epoch": float(m[1]), "loss": _pick_loss(losses),
                "rate": _float(m[4]) if m[4] else None, "rate_unit": "it/s" if m[4] else None}
    if not (bar := _match_bar(text)) or _EVAL_DESC.search(bar["desc"] or ""):
        return None
    epoch = _EPOCH_DESC.match(bar["desc"] or "")
    # the loss sits in the postfix, or (NeMo, no rate shown) where the rate would be, or in the
    # description (torchtune: `1|100|Loss: 2.345: 10%|…`)
    where = f'{bar["desc"]} {bar["rate"]} {bar["post"]}'
    losses = {_norm(k): _float(v) for k, v in _POSTFIX_LOSS.findall(where)}
    if not epoch and not losses:
        return None
    out = {"step": _count(bar["n"]), "total": _count(bar["total"]), "loss": _pick_loss(losses),
           "epoch": float(epoch[1]) if epoch else None}
    if r := re.fullmatch(r"[ \t]*([\d.]+)(it/s|s/it)[ \t]*", bar["rate"] or ""):
        value = float(r[1]) if r[1].count(".") < 2 else 0.0
        out["rate"], out["rate_unit"] = _rate(_norm(r[2]), value) or (None, None)
    return out


_RECOGNISERS = (("megatron", _megatron), ("torchtitan", _torchtitan), ("lightning", _lightning),
                ("hf", _hf), ("nanogpt", _nanogpt), ("kv", _kv))


def parse_step(line: str, custom: re.Pattern[str] | None = None) -> Step | None:
    """One progress line of a training loop, or None. Tries each known format, then `custom`."""
    frames = [f for f in strip_ansi(line).split("\r") if f.strip()]
    for shown in reversed(frames[-2:]):  # a \r-joined line: its last frames are what was seen last
        text = split_rank_prefix(shown)[1].strip()
        for fmt, recognise in _RECOGNISERS:
            if (found := recognise(text)) is not None:
                return Step(line=shown.strip(), fmt=fmt, **_fields(found))
        if custom is not None and (custom.search(shown) or custom.search(text)):
            return Step(line=shown.strip(), fmt="custom", **_fields(_generic(text)))
    return None


def _ci(word: str) -> str:
    return "".join(f"[{c.upper()}{c.lower()}]" if c.isalpha() else c for c in word)


_ERE_RATE = "(" + "|".join(["/[Ss]", "/[Ii][Tt]", "[Pp][Ee][Rr][^A-Za-z0-9]*[Ss]",  # tok/s, s/it, tokens_per_sec
                             *map(_ci, ("tps", "wps", "tgs", "throughput"))]) + ")"
_ERE = "|".join([
    # step/iter/iteration keys in every form: key=, key:, key [, key N (kv, torchtitan, megatron, nanoGPT)
    # (a number may follow a colour code: [^A-Za-z \t] rather than [0-9])
    "(" + _ci("step") + "|" + _ci("iter") + "(" + _ci("ation") + ")?)([ \t]*[=:]|[ \t]*\\[|[ \t]+[^A-Za-z \t])",
    _ci("updates") + "[ \t]*[=:]",  # fairseq's num_updates=
    _ci("steps") + "[ \t]*[=:].*" + _ci("loss"), _ci("loss") + ".*" + _ci("steps") + "[ \t]*[=:]",  # DeepSpeed
    _ci("loss") + "[A-Za-z0-9_/.-]*(['\"]|=)",  # HF/JSON dict keys, tqdm postfixes
    _ci("loss") + ".*" + _ERE_RATE, _ERE_RATE + ".*" + _ci("loss"),  # kv lines without a step key
    _ci("epoch") + "[ \t]*[^A-Za-z \t]",  # Lightning bars
])
# Python class escapes as POSIX brackets (busybox grep knows none of them). The negated ones
# have no form inside [...]; the config refuses a backslash there anyway.
_PY_CLASS = {"d": ("[0-9]", "0-9"), "s": ("[ \t]", " \t"), "w": ("[A-Za-z0-9_]", "A-Za-z0-9_"),
             "D": ("[^0-9]", None), "S": ("[^ \t]", None), "W": ("[^A-Za-z0-9_]", None)}


def _to_ere(pattern: str) -> str:
    """Translate Python's \\d \\s \\w (also inside [...]) and \\D \\S \\W for grep; everything else is kept."""
    out, in_class, i = [], False, 0
    while i < len(pattern):
        c = pattern[i]
        if c == "\\" and i + 1 < len(pattern):
            nxt = pattern[i + 1]
            out.append(_PY_CLASS[nxt][in_class] or c + nxt if nxt in _PY_CLASS else c + nxt)
            i += 2
            continue
        in_class = (in_class and c != "]") or (not in_class and c == "[")
        out.append(c)
        i += 1
    return "".join(out)


def step_grep_ere(custom: str | None = None) -> str:
    """One POSIX ERE matching every line parse_step may accept (a pre-filter for `grep -aE`).

    Run it with LC_ALL=C: in a UTF-8 locale GNU grep's `.` does not match invalid bytes.
    """
    return f"({_ERE})|({_to_ere(custom)})" if custom else _ERE


_Q = r"\d+(?:\.\d+)?(?:[kKMGTPEZY]i?)?"
_BAR = re.compile(
    rf"^[ \t]*(?:(?P<desc>.*?):[ \t]*)?(?:(?P<pct>\d{{1,3}})%)?\|(?P<bar>[^|]*)\|[ \t]*(?P<n>{_Q})/(?P<total>{_Q}|\?)"
    r"(?:[ \t]*\[(?P<el>[^<,\]]*)(?:<(?P<rem>[^,\]]*))?(?:,[ \t]*(?P<rate>[^,\]]*))?(?P<post>,[^\]]*)?\])?[ \t]*$"
)
_BAR_OPEN = re.compile(  # unknown total: `Map: 1310 examples [00:01, 999 examples/s]`
    rf"^[ \t]*(?:(?P<desc>.*?):[ \t]*)?(?P<n>{_Q})[ \t]?[A-Za-z ]{{0,40}}\[(?P<el>\d+:\d\d(?::\d\d)?),[ \t]*"
    r"(?P<rate>(?:\?|[\d.]+[ \t]?[kMG]?)[ \t]?[A-Za-z ]{0,40}/s|[\d.]+s/[A-Za-z ]{1,40})(?P<post>,[^\]]*)?\][ \t]*$"
)


def _match_bar(text: str) -> dict | None:
    if "|" in text and (m := _BAR.match(text)) and (m["pct"] is not None or m["el"] is not None):
        return m.groupdict()
    if "[" in text and (m := _BAR_OPEN.match(text)):
        return {**m.groupdict(), "pct": None, "total": None, "rem": None}
    return None


def _count(q: str | None) -> int | None:
    """tqdm's n_fmt/total_fmt, unit_scale included: `1.2k` -> 1200, `1.00G` -> 10**9."""
    if not q or q == "?" or not (m := re.fullmatch(r"(\d+(?:\.\d+)?)(?:([kKMGTPEZY])(i?))?", q)):
        return None
    power = " kMGTPEZY".index(m[2].replace("K", "k")) if m[2] else 0
    return round(float(m[1]) * (1024 if m[3] else 1000) ** power) if len(m[1]) < 19 else None


def _known(field: str | None) -> str | None:
    return None if not field or "?" in field else field.strip()  # "?" is tqdm's "unknown"


def parse_bar(frame: str) -> Bar | None:
    """One tqdm frame as a Bar, or None when the text is not a progress bar."""
    shown = strip_ansi(frame).strip()
    if not (m := _match_bar(split_rank_prefix(shown)[1])):
        return None
    n, total = _count(m["n"]), _count(m["total"])
    pct = int(m["pct"]) if m["pct"] else (min(100, n * 100 // total) if n is not None and total else None)
    return Bar(desc=(m["desc"] or "").strip(), pct=pct, n=n, total=total, rate=_known(m["rate"]),
               elapsed=_known(m["el"]), remaining=_known(m["rem"]), frame=shown)


def last_bar_frame(chunk: str) -> str | None:
    """The last tqdm frame in text whose frames are separated by \\r (and lines by \\n)."""
    for frame in reversed(re.split(r"[\r\n]", chunk)):
        if ("|" in frame or "[" in frame) and parse_bar(frame) is not None:
            return frame.rstrip()
    return None
