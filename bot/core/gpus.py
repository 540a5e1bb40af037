"""Parse nvidia-smi (readings, the driver's window) and classify each GPU (busy, oscillating, low, idle, unknown) by role."""

from __future__ import annotations

import math
import re
import statistics
from dataclasses import dataclass
from typing import Iterable, Mapping, Sequence

from bot.core import humanize as hz
from bot.core.facts import GpuMethod, GpuReadings, GpuSample, UtilWindow, WindowGap
from bot.core.gpu_window import bus_key, match, parse_utilization
from bot.core.redact import redact_secrets


# One reading of utilization.gpu covers a fraction of a second, so a verdict needs several.
# A GPU doing real work reads well above half; below that it waits more than it computes.
BUSY_MIN_PCT = 50.0
# "Busy" = high in *most* samples (strictly more than this share): a healthy loop that sleeps
# between steps can read 0 then 100 in turn, and that must stay "oscillating", not "busy".
BUSY_MIN_SHARE = 0.5
# nvidia-smi prints whole percents; 1 % is its noise floor, any kernel launched reads more.
IDLE_MAX_PCT = 1.0
# The driver's window gives Max, Min and Avg, not each sample. A training loop's GPU sits near its top
# while it computes and near 0 while it waits, so the share of the window spent high is about
# (Avg - Min) / (Max - Min) (exact for two levels). "Busy" still means high in most of the window, but
# the estimate is off by a sample or two in 71 and by the driver's whole-percent Avg: a 50 % duty cycle
# reads Avg 49 to 51 (the H200 capture: 99 / 0 / 49), and must stay "oscillating" whichever it reads.
# Above 60 % the loop is clearly high most of the time.
WINDOW_BUSY_SHARE = 0.6
# A CUDA context plus allocator overhead is ~0.3-0.6 GiB on any card, and an unused GPU
# shows a few MiB; above 1 GiB some process put weights or buffers there.
HOLDS_MEMORY_MIB = 1024.0
# A role member under 60 % of its siblings' median suggests its model is missing: the real
# case is 43 GB against 77 and 97 GB (0.5), while the doc's target stages span 67-97 GB (0.94).
UNEVEN_RATIO = 0.6
# Activations and caches legitimately differ by a few GB between siblings; ignore that.
UNEVEN_MIN_GAP_MIB = 4096.0
# Errors end up on a phone screen.
MAX_ERROR_CHARS = 160
# Error text can be huge (a 1 MB line); look only at its start when matching known messages.
_SCAN_LINES, _SCAN_CHARS = 20, 1000
# nvidia-smi queries have a few dozen fields at most; a wider line is garbage, not worth splitting.
_MAX_COLUMNS = 64

MISSING = "nvidia-smi not found on the probe's PATH"

# The probe's --query-gpu: the bus id matches the rows to the blocks of `nvidia-smi -q`.
PROBE_QUERY = ("index", "pci.bus_id", "memory.used", "memory.total", "utilization.gpu")
_FIELDS = PROBE_QUERY  # the fields runbot reads; a header may list them in any order
_UNITS = {"memory.used": "mib", "memory.total": "mib", "utilization.gpu": "%"}
# Without a header the columns tell the query: the probe's own (a bus id second), the four of probes
# before issue 12 (wider queries append theirs), or the three an operator types by hand.
_LAYOUT3 = {"index": 0, "memory.used": 1, "utilization.gpu": 2}
_LAYOUT4 = {"index": 0, "memory.used": 1, "memory.total": 2, "utilization.gpu": 3}
_LAYOUT_PROBE = {name: i for i, name in enumerate(PROBE_QUERY)}
_INDEX = re.compile(r"[0-9]{1,6}")
_VALUE = re.compile(r"([0-9]{1,12}(?:\.[0-9]{1,6})?)\s*(mib|%)?", re.I)
_HEADER_FIELD = re.compile(r"([a-z][a-z0-9_.]*)\s*(?:\[[^\]]*\])?", re.I)
_ROWISH = re.compile(r"\s*[0-9]+\s*,")
_ROUND = re.compile(r"#\s*sample\b")
_RC = re.compile(r"\brc=(-?[0-9]{1,6})\b")
_T = re.compile(r"\bt=([0-9]{1,12}(?:\.[0-9]{1,9})?)\b")

# nvidia-smi's documented exit codes (and the shell's), for a failing round that printed nothing.
_RC_MEANING = {
    2: "nvidia-smi: invalid argument", 4: "nvidia-smi: permission denied", 6: "nvidia-smi: no devices were found",
    9: "nvidia-smi failed: NVIDIA driver not loaded", 12: "nvidia-smi: NVML library not found",
    15: "nvidia-smi: a GPU fell off the bus", 124: "nvidia-smi timed out", 126: "nvidia-smi is not executable",
    127: MISSING,
}


# Messages nvidia-smi (or the shell) prints instead of rows, and the sentence users get.
# "{0}" is the pattern's group, "{first}" the line's first sentence.
_KNOWN = tuple((re.compile(pattern, re.I), template) for pattern, template in (
    (r"couldn't communicate with the NVIDIA driver", "nvidia-smi failed: NVIDIA driver not loaded ({first})"),
    (r"Failed to initialize NVML: ?(.*)", "nvidia-smi: Failed to initialize NVML: {0}"),
    (r"No devices were found", "nvidia-smi: no devices were found"),
    (r'Field "([^"]{0,100})" is not a valid field', 'nvidia-smi: unknown query field "{0}"'),
    (r"nvidia-smi: (?:command )?not found|nvidia-smi: No such file", MISSING),
    (r"GPU is lost", "nvidia-smi: a GPU fell off the bus (GPU is lost; the host needs a reboot)"),
    (r"Insufficient Permissions", "nvidia-smi: insufficient permissions"),
    (r"NVIDIA-SMI \S+ +Driver Version", "nvidia-smi printed its status table, not the CSV query"),
))


def _cap(text: str) -> str:
    # Redacted before any cut (callers pass at most a scanned line, _SCAN_CHARS): nvidia-smi's text is the CT's.
    text = " ".join("".join(c if c.isprintable() else " " for c in redact_secrets(text)[: MAX_ERROR_CHARS * 2]).split())
    return text if len(text) <= MAX_ERROR_CHARS else text[: MAX_ERROR_CHARS - 1] + "…"


def _lines(text: str) -> list[str]:
    # NUL bytes come from truncated or binary output; splitlines() also splits on a bare \r.
    return text.replace("\x00", "").splitlines()


def _explain(junk: list[str]) -> str:
    """One sentence for the lines that were not data rows."""
    for line in junk[:_SCAN_LINES]:
        probe = line[:_SCAN_CHARS]
        for pattern, template in _KNOWN:
            if m := pattern.search(probe):
                first = probe[: probe.find(". ")] + "…" if ". " in probe else probe.rstrip(".")
                return _cap(template.format(*(g.strip() for g in m.groups()), first=first))
    if _ROWISH.match(junk[0][:_SCAN_CHARS]):
        return _cap(f"nvidia-smi printed a garbled row: '{junk[0][:_SCAN_CHARS]}'")
    return _cap(f"nvidia-smi: {junk[0][:_SCAN_CHARS]}")


def _no_value(field: str) -> bool:
    return field.upper() == "N/A" or field.startswith("[")  # [N/A], [Not Supported], [Unknown Error]…


def _value(field: str, unit: str) -> tuple[bool, float | None]:
    """(ok, number): ok is False when the field is neither a number in `unit` nor a non-value."""
    if _no_value(field):
        return True, None
    m = _VALUE.fullmatch(field)
    if not m or (m[2] and m[2].lower() != unit):
        return False, None
    number = float(m[1])
    return (number <= 100.0, number) if unit == "%" else (True, number)


def _sample(fields: list[str], columns: Mapping[str, int]) -> GpuSample | None:
    """The row as a sample, or None when it is not one. Callers checked len(fields) against columns."""
    pos = columns.get("index")
    # nvidia-smi never prints an empty field (it prints [N/A]): "0,0,0," is a broken line.
    if pos is None or not _INDEX.fullmatch(fields[pos]) or "" in fields:
        return None
    got: dict[str, float | None] = {}
    for name, unit in _UNITS.items():
        ok, got[name] = _value(fields[columns[name]], unit) if name in columns else (True, None)
        if not ok:
            return None
    bus = None
    if (at := columns.get("pci.bus_id")) is not None and not _no_value(fields[at]):
        if (bus := bus_key(fields[at])) is None:
            return None
    return GpuSample(int(fields[pos]), got["utilization.gpu"], got["memory.used"], got["memory.total"], bus)


def _header(fields: list[str]) -> dict[str, int] | None:
    """Column positions when the line is a header ("index, memory.used [MiB], …"), else None."""
    names = [m[1].lower() for f in fields if (m := _HEADER_FIELD.fullmatch(f))]
    if len(names) < len(fields) or not set(names) & set(_FIELDS):
        return None
    return {name: i for i, name in enumerate(names) if name in _FIELDS}


def parse_query_csv(text: str) -> tuple[list[GpuSample], str | None]:
    """Rows of `nvidia-smi --query-gpu=index,pci.bus_id,memory.used,memory.total,utilization.gpu --format=csv…`.

    Anything that is not a data row is error text (stderr is merged in), summed up as one
    sentence; rows printed before or after an error are kept.
    """
    rows: list[GpuSample] = []
    junk: list[str] = []
    columns: dict[str, int] | None = None
    width: int | None = None  # rows of one output all have the same column count
    for raw in _lines(text):
        line = raw.strip()
        if not line:
            continue
        fields = [f.strip() for f in line.split(",", _MAX_COLUMNS)]
        header = _header(fields) if len(fields) <= _MAX_COLUMNS else None
        if header is not None:
            columns, width = header, len(fields)
            continue
        sample = None
        if len(fields) <= _MAX_COLUMNS and (width is None or len(fields) == width):
            if columns is not None:
                sample = _sample(fields, columns)
            elif len(fields) == 3:
                sample = _sample(fields, _LAYOUT3)
            elif len(fields) == len(PROBE_QUERY) and (bus_key(fields[1]) is not None or _no_value(fields[1])):
                sample = _sample(fields, _LAYOUT_PROBE)
            elif len(fields) >= 4:
                sample = _sample(fields, _LAYOUT4)
        if sample is None:
            junk.append(line)
            continue
        width = len(fields)
        rows.append(sample)
    if columns is not None and "index" not in columns:
        return rows, "nvidia-smi output has no index column"
    return rows, (_explain(junk) if junk else None)


def parse_gpu_section(body: str, window: str | None = None, window_rc: int | None = None) -> GpuReadings:
    """The probe's GPU sections: `gpus`, `@missing` or rounds of `# sample N t=… rc=N` then CSV rows, and
    `gpu.window` with its exit status: the driver's window, None where the probe did not ask (before issue 12)."""
    lines = _lines(body)
    first = next((line.strip() for line in lines if line.strip()), None)
    if first is None:
        return GpuReadings(error="GPU section empty: probe output truncated?")
    if first == "@missing":
        return GpuReadings(error=MISSING)
    preamble: list[str] = []
    rounds: list[tuple[int | None, list[str]]] = []
    stamps: list[float] = []
    for line in lines:
        if _ROUND.match(line.strip()):
            m = _RC.search(line[:_SCAN_CHARS])
            rounds.append((int(m[1]) if m else None, []))  # no rc: header cut short
            if t := _T.search(line[:_SCAN_CHARS]):
                stamps.append(float(t[1]))
        else:
            (rounds[-1][1] if rounds else preamble).append(line)
    samples: list[tuple[GpuSample, ...]] = []
    errors: list[str] = []
    for n, (rc, round_lines) in enumerate([(None, preamble), *rounds]):
        rows, err = parse_query_csv("\n".join(round_lines))
        if rows:
            samples.append(tuple(rows))
        if n == 0 and rounds and any(line.strip() for line in preamble):
            err = _cap(f"GPU section has stray text before its first '# sample': {first[:_SCAN_CHARS]}")
        elif n == 0 and err and not rows:  # a bare CSV with no round header is tolerated
            err = _cap(f"GPU section unreadable (no '# sample' round): {first[:_SCAN_CHARS]}")
        elif rc not in (0, None) and not err:
            err = _RC_MEANING.get(rc, f"nvidia-smi failed with exit status {rc}")
        if err:
            errors.append(err)
    if not samples and not errors:
        errors.append("nvidia-smi printed no GPU rows")
    windows: tuple[tuple[int, UtilWindow], ...] = ()
    gap = None
    if window is not None:
        blocks, gap = ({}, WindowGap.FAILED) if window_rc not in (0, None) else parse_utilization(window)
        windows, gap = match(blocks, gap, [s for round_ in samples for s in round_])
    span = max(stamps) - min(stamps) if len(stamps) > 1 else None
    return GpuReadings(samples=tuple(samples), error=errors[0] if errors else None, windows=windows, gap=gap,
                       span_s=span)


def _number(x: object) -> float | None:
    """A usable reading: finite and not negative; anything else counts as not printed."""
    try:
        value = float(x) if isinstance(x, (int, float)) and not isinstance(x, bool) else math.nan
    except OverflowError:  # an int too large for a float
        value = math.nan
    return value if math.isfinite(value) and value >= 0 else None


def format_indices(indices: Iterable[int]) -> str:
    """[0, 1, 2, 3, 4, 6] -> "0–4, 6": consecutive indices become en-dash ranges."""
    runs: list[list[int]] = []
    for i in sorted(set(indices)):
        if runs and i == runs[-1][1] + 1:
            runs[-1][1] = i
        else:
            runs.append([i, i])
    return ", ".join(str(a) if a == b else f"{a}–{b}" for a, b in runs)


def util_words(g: GpuState, *, now: bool = True) -> str:
    """A GPU's utilisation as its answer row shows it: "avg 49 · 0–99 · now 75" from the window, else the readings."""
    if g.window is None:
        return " ".join("?" if u is None else f"{u:.0f}" for u in g.utils)
    w = g.window
    text = f"avg {w.avg_pct:.0f} · {w.min_pct:.0f}–{w.max_pct:.0f}"
    return text + (f" · now {'?' if g.now_pct is None else f'{g.now_pct:.0f}'}" if now else "")


def _gb_range(mibs: Iterable[float]) -> str:
    values = sorted(mibs)
    lo, hi = values[0], values[-1]
    return hz.gib(lo) if hz.gib(lo) == hz.gib(hi) else hz.gib(lo, hi, sep="–")


@dataclass(frozen=True)
class GpuState:
    """One GPU's verdict over the driver's window, or over all sampling rounds."""

    index: int
    role: str | None
    cls: str  # "busy" | "oscillating" | "low" | "idle" | "unknown"
    utils: tuple[float | None, ...]  # one per round that listed this GPU (with a window: the one reading)
    mem_used_mib: float | None  # the latest reading
    mem_total_mib: float | None
    holds_memory: bool
    window: UtilWindow | None = None  # the driver's window the class was read from; None: from utils

    @property
    def busy_share(self) -> float | None:
        """The share of the time at BUSY_MIN_PCT or more: estimated over the window, else counted in readings."""
        return _window_share(self.window) if self.window is not None else _readings_share(self.utils)

    @property
    def floor(self) -> float | None:
        """The lowest utilisation seen: the window's Min, else the lowest reading (one nvidia-smi could not
        print counts as 0: nothing shows it was high)."""
        if self.window is not None:
            return self.window.min_pct
        return min((u or 0.0) for u in self.utils) if self.utils else None

    @property
    def now_pct(self) -> float | None:
        """The latest instantaneous reading."""
        return self.utils[-1] if self.utils else None


@dataclass(frozen=True)
class GpuBasis:
    """What a report's utilisation rests on, in the words `gpus` answers show."""

    method: GpuMethod = GpuMethod.READINGS
    seconds: float | None = None  # the window's Duration, or first reading to last
    count: int = 0  # the driver's samples in the window, or the probe's readings
    gap: WindowGap | None = None  # why not the window, where the probe asked the driver for it

    def phrase(self) -> str:
        """"driver window 14 s, 71 samples", or "5 readings over 0.8 s (driver window: N/A)"."""
        if self.method is GpuMethod.WINDOW:
            return f"driver window {_seconds(self.seconds)}, {self.count} sample{'s' * (self.count != 1)}"
        text = f"{self.count} reading{'s' * (self.count != 1)}"
        text += f" over {_seconds(self.seconds)}" if self.count > 1 and self.seconds is not None else ""
        return text + (f" (driver window: {self.gap.value})" if self.gap is not None else "")


def _seconds(s: float | None) -> str:
    """Readings span about a second, so tenths matter there ("0.8 s"); a window is "14 s"."""
    return hz.duration(s) if s is None or s >= 9.95 else f"{s:.1f}".removesuffix(".0") + " s"


# Order and wording of class groups in summaries; idle splits on memory held.
_LABELS = ((("busy", False), "busy"), (("oscillating", False), "oscillating"), (("low", False), "low"),
           (("idle", True), "idle (memory held)"), (("idle", False), "idle"), (("unknown", False), "util unknown"))


@dataclass(frozen=True)
class GpuReport:
    """Every GPU's state, grouped by the configured roles, with what looks wrong."""

    gpus: tuple[GpuState, ...] = ()
    roles: tuple[tuple[str, tuple[int, ...]], ...] = ()
    error: str | None = None
    findings: tuple[str, ...] = ()
    basis: GpuBasis = GpuBasis()

    def by_index(self, index: int) -> GpuState | None:
        return next((g for g in self.gpus if g.index == index), None)

    def in_role(self, role: str | None) -> list[GpuState]:
        return [g for g in self.gpus if g.role == role]

    def idle_with_memory(self) -> list[GpuState]:
        return [g for g in self.gpus if g.cls == "idle" and g.holds_memory]

    def busy(self) -> list[GpuState]:
        return [g for g in self.gpus if g.cls == "busy"]

    def idle(self) -> list[GpuState]:
        return [g for g in self.gpus if g.cls == "idle"]

    def _groups(self) -> list[tuple[str | None, list[tuple[list[int], str]]]]:
        """(role, [([0, 1], "0–1 busy"), …]) per role in configured order, then GPUs of no role."""
        reported = {g.index for g in self.gpus}
        out: list[tuple[str | None, list[tuple[list[int], str]]]] = []
        for role, indices in [*self.roles, (None, ())]:
            states = self.in_role(role)
            groups = [([g.index for g in states if (g.cls, g.cls == "idle" and g.holds_memory) == key], label)
                      for key, label in _LABELS]
            groups.append(([i for i in indices if i not in reported] if self.gpus else [], "not reported"))
            if segments := [(idx, f"{format_indices(idx)} {label}") for idx, label in groups if idx]:
                out.append((role, segments))
        return out

    def _name(self, role: str | None, count: int) -> str:
        return role if role is not None else "other" if self.roles else "GPU" if count == 1 else "GPUs"

    def summary(self) -> str:
        """One phone line: "target 0–4 busy · drafter 5–7 idle (memory held)"."""
        if not self.gpus:
            return f"GPUs: {self.error or 'none reported'}"
        text = " · ".join(f"{self._name(role, len(segs[0][0]))} {' · '.join(t for _, t in segs)}"
                          for role, segs in self._groups())
        return f"{text} · {self.error}" if self.error else text

    def lines(self) -> list[str]:
        """A line per role (per class group without roles), the error, then a line per finding."""
        out: list[str] = []
        for role, segs in self._groups():
            if self.roles:
                out.append(f"{self._name(role, 2)} {' · '.join(t for _, t in segs)}")
            else:
                out.extend(f"{self._name(None, len(idx))} {t}" for idx, t in segs)
        return out + ([self.error] if self.error else []) + list(self.findings)


def _readings_share(utils: Sequence[float | None]) -> float | None:
    numbers = [u for u in utils if u is not None]
    return sum(u >= BUSY_MIN_PCT for u in numbers) / len(numbers) if numbers else None


def _window_share(w: UtilWindow) -> float:
    """The window's share spent high, from Min/Max/Avg: exact for a loop that computes, then waits."""
    if w.min_pct >= BUSY_MIN_PCT:
        return 1.0
    if w.max_pct < BUSY_MIN_PCT:
        return 0.0
    return min(1.0, max(0.0, (w.avg_pct - w.min_pct) / (w.max_pct - w.min_pct)))


def _classify_one(share: float | None, top: float, busy_share: float) -> str:
    """The class from the share of time high and the highest utilisation seen, readings or window alike."""
    if share is None:
        return "unknown"
    if top <= IDLE_MAX_PCT:
        return "idle"
    if share > busy_share:
        return "busy"
    # Never high, not quite zero: weights being copied in (0 2 1 2 2 % on the real GPU run), or
    # short bursts the sampling mostly missed. "Oscillating" would promise a loop seen working.
    return "oscillating" if top >= BUSY_MIN_PCT else "low"


def _state(index: int, role: str | None, seen: Sequence[GpuSample], window: UtilWindow | None) -> GpuState:
    utils = tuple(_number(s.util_pct) for s in seen)
    used = next((v for s in reversed(seen) if (v := _number(s.mem_used_mib)) is not None), None)
    total = next((v for s in reversed(seen) if (v := _number(s.mem_total_mib)) is not None), None)
    if window is not None:
        cls = _classify_one(_window_share(window), window.max_pct, WINDOW_BUSY_SHARE)
    else:
        cls = _classify_one(_readings_share(utils), max((u for u in utils if u is not None), default=0.0),
                            BUSY_MIN_SHARE)
    return GpuState(index, role, cls, utils, used, total, used is not None and used > HOLDS_MEMORY_MIB, window)


def _basis(readings: GpuReadings) -> GpuBasis:
    """The window's shortest Duration and fewest samples across GPUs (they agree on real drivers), or the readings."""
    if readings.method is GpuMethod.WINDOW:
        windows = [w for _, w in readings.windows]
        return GpuBasis(GpuMethod.WINDOW, min(w.duration_s for w in windows), min(w.samples for w in windows))
    return GpuBasis(GpuMethod.READINGS, readings.span_s, len(readings.samples), readings.gap)


def classify(readings: GpuReadings, roles: Mapping[str, Sequence[int]] | None = None) -> GpuReport:
    """Classify every GPU over the driver's window (else over all rounds) and note what looks wrong in each role."""
    role_list = tuple((str(name), tuple(dict.fromkeys(int(i) for i in idx))) for name, idx in (roles or {}).items())
    role_of: dict[int, str] = {}
    for name, indices in role_list:
        for i in indices:
            role_of.setdefault(i, name)  # an index listed under two roles belongs to the first
    seen: dict[int, list[GpuSample]] = {}
    for round_ in readings.samples:
        for s in round_:
            seen.setdefault(s.index, []).append(s)
    windows = dict(readings.windows)
    gpus = [_state(index, role_of.get(index), seen[index], windows.get(index)) for index in sorted(seen)]
    return GpuReport(tuple(gpus), role_list, readings.error, tuple(_findings(gpus, role_list)), _basis(readings))


def _findings(gpus: list[GpuState], roles: Sequence[tuple[str, tuple[int, ...]]]) -> list[str]:
    """Uneven memory inside a role, idle GPUs holding memory, role GPUs nvidia-smi did not list."""
    uneven, held_idle, unreported = [], [], []
    reported = {g.index for g in gpus}
    for role, indices in [*roles, (None, ())]:
        members = [(g, g.mem_used_mib) for g in gpus if g.role == role and g.mem_used_mib is not None]
        for g, mib in members if role is not None else ():  # siblings exist only inside a role
            others = [m for s, m in members if s is not g]
            median = statistics.median(others) if others else 0.0
            if mib < UNEVEN_RATIO * median and median - mib >= UNEVEN_MIN_GAP_MIB:
                uneven.append(f"{role} GPU {g.index} holds {hz.gib(mib)}, its siblings "
                              f"{_gb_range(others)}: model not loaded or its thread died?")
        # Idle with memory held: a process owns the GPU but does nothing (hung or dead worker).
        held = [(g.index, mib) for g, mib in members if g.cls == "idle" and g.holds_memory]
        if held:
            who = f"{role} " if role is not None else ""
            noun = "GPU" if len(held) == 1 else "GPUs"
            held_idle.append(f"{who}{noun} {format_indices(i for i, _ in held)} idle with "
                             f"{_gb_range(m for _, m in held)} held")
        missing = [i for i in indices if i not in reported]
        if missing and gpus:  # with no rows at all the error says it; listing roles is noise
            noun = "GPU" if len(missing) == 1 else "GPUs"
            unreported.append(f"{noun} {format_indices(missing)} ({role}) not reported by nvidia-smi")
    return uneven + held_idle + unreported
