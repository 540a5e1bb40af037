"""Read the driver's GPU-utilisation window (`nvidia-smi -q -d UTILIZATION`) per GPU, matched to indices by bus id."""

from __future__ import annotations

import re
from typing import Iterable, Mapping

from bot.core.facts import GpuSample, UtilWindow, WindowGap

# Real drivers keep ~14 s (71 samples on the H200, driver 580). A Duration past ten minutes is no window
# but a broken counter: some drivers print 18446744073709 sec, an unsigned -1 in microseconds.
MAX_WINDOW_S = 600.0

# `GPU 00000000:00:06.0` at the start of a line opens a GPU's block; the query's pci.bus_id is the same text.
_HEADER = re.compile(r"GPU (\S+)\s*")
_BUS = re.compile(r"([0-9A-Fa-f]+):([0-9A-Fa-f]+):([0-9A-Fa-f]+)\.([0-9A-Fa-f]+)")  # domain:bus:device.function
_SUBBLOCK = re.compile(r" {4}(\S.*?)\s*")  # `    GPU Utilization Samples`: a block's sub-block title
_FIELD = re.compile(r" {8}(\S.*?)\s*:\s*(.*?)\s*")  # `        Max       : 99 %`, inside a sub-block
# No digit limits: a number too long to be real still reads, and fails the range checks, as in awk.
_SECONDS = re.compile(r"([0-9]+(?:\.[0-9]+)?) sec")
_PERCENT = re.compile(r"([0-9]+) %")
_COUNT = re.compile(r"[0-9]+")
# `-d UTILIZATION` names neither MIG nor vGPU for a whole card of its own (the H200 captures). A block
# that mentions them (MIG devices, vGPU ID, Host VGPU Mode) is a card shared with others, whose
# utilisation mixes their work in; at worst a needless fallback to readings.
_MIG = re.compile(r"\bMIG\b")
_VGPU = re.compile(r"\b[vV]GPU")
_SAMPLES = "GPU Utilization Samples"
_KEYS = ("Duration", "Number of Samples", "Max", "Min", "Avg")
_NOT_AVAILABLE = ("N/A", "[N/A]", "Not Supported", "[Not Supported]")


def bus_key(text: str) -> str | None:
    """`00000000:00:06.0` -> `0:0:6.0`: the -q headers and the query's pci.bus_id, compared by value."""
    m = _BUS.fullmatch(text.strip())
    return ":".join(f"{int(p, 16):x}" for p in m.groups()[:3]) + f".{int(m[4], 16):x}" if m else None


def parse_utilization(text: str) -> tuple[dict[str, UtilWindow | WindowGap], WindowGap | None]:
    """Each GPU's window (or why it has none) by bus key, and a gap for the whole output (no GPU in it)."""
    blocks: dict[str, list[list[str]]] = {}  # a bus id printed twice: its blocks in order
    current: list[str] | None = None
    for line in text.replace("\x00", "").splitlines():
        if m := _HEADER.fullmatch(line):
            key = bus_key(m[1])
            current = None if key is None else []
            if key is not None:
                blocks.setdefault(key, []).append(current)
        elif current is not None:
            current.append(line)
    if not blocks:
        return {}, WindowGap.MISSING
    return {bus: _window(parts) for bus, parts in blocks.items()}, None


def _window(parts: list[list[str]]) -> UtilWindow | WindowGap:
    """One GPU's `GPU Utilization Samples`, checked the way the probe's `window_ok` checks it."""
    lines = [line for part in parts for line in part]
    if any(_MIG.search(line) for line in lines):
        return WindowGap.MIG
    if any(_VGPU.search(line) for line in lines):
        return WindowGap.VGPU
    fields: dict[str, str] = {}
    for part in parts:
        title = None
        for line in part:
            if m := _SUBBLOCK.fullmatch(line):
                title = m[1]
            elif title == _SAMPLES and (m := _FIELD.fullmatch(line)):
                fields.setdefault(m[1], m[2])  # the first one printed, as awk keeps it
    if any(k not in fields for k in _KEYS):
        return WindowGap.MISSING
    if any(fields[k] in _NOT_AVAILABLE for k in _KEYS):
        return WindowGap.NOT_AVAILABLE
    duration, count = _SECONDS.fullmatch(fields["Duration"]), _COUNT.fullmatch(fields["Number of Samples"])
    pct = [_PERCENT.fullmatch(fields[k]) for k in ("Max", "Min", "Avg")]
    if duration is None or count is None or not all(pct):
        return WindowGap.UNREADABLE
    hi, lo, avg = (float(m[1]) for m in pct if m)
    seconds, n = float(duration[1]), float(count[0])  # float: any length of digits, no int() limit
    if not (0.0 < seconds <= MAX_WINDOW_S):
        return WindowGap.ABSURD_DURATION
    if n == 0:
        return WindowGap.NO_SAMPLES
    if not (lo <= avg <= hi <= 100.0):  # the driver's Avg is of the same samples: never outside them
        return WindowGap.UNREADABLE
    return UtilWindow(seconds, int(min(n, 1e12)), hi, lo, avg)


def match(blocks: Mapping[str, UtilWindow | WindowGap], gap: WindowGap | None,
          rows: Iterable[GpuSample]) -> tuple[tuple[tuple[int, UtilWindow], ...], WindowGap | None]:
    """Every GPU of the reading with its window, or none and why: all or nothing, like the probe.

    One GPU without a window makes the probe take its readings for all of them, and one basis for the
    whole answer is what users can read ("driver window 14 s" or "5 readings over 1 s")."""
    if gap is not None:
        return (), gap
    out: dict[int, UtilWindow] = {}
    for row in sorted(rows, key=lambda r: r.index):
        if row.index in out:  # a later round's row of the same GPU
            continue
        found = blocks.get(row.bus_id) if row.bus_id is not None else None
        if found is None:
            return (), WindowGap.UNMATCHED
        if isinstance(found, WindowGap):
            return (), found
        out[row.index] = found
    return tuple(out.items()), None
