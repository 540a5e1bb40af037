"""Pure apart from matplotlib: a run's history as a PNG a phone can read (`/run plot`, `runbot plot`).

matplotlib is imported inside chart(), never at module import: the rest of the bot (and the purity
test's import of every renderer) never loads it. Rendering uses a Figure of its own (no pyplot, no
global figure list) under a lock, because rcParams are process-wide.
"""

from __future__ import annotations

import io
import itertools
import math
import threading
from collections.abc import Sequence

from bot.core import humanize
from bot.core.history import Point

METRICS = ("loss", "rate", "gpus")
DEFAULT_WINDOW_S = 6 * 3600.0
MAX_WINDOW_S = 30 * 86400.0  # the state file keeps a sparser history beyond a day; a month is plenty for a phone
WIDTH_IN, HEIGHT_IN, DPI = 9.0, 5.0, 100  # 900 x 500 px: wide enough to read on a phone held sideways
ABSURD = 1e30  # beyond this a "value" is a parsing accident, not a measurement
# Colours for lines: no red (red is an incident's mark).
PALETTE = ("#1f77b4", "#ff7f0e", "#2ca02c", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf")
INCIDENT = "#d62728"
RESTART = "#555555"
BUSY_BINS = 240  # busy shares jump probe to probe: over a long window, each of this many slices shows its mean
MARKERS_UP_TO = 120  # fewer points than this: each one gets a dot (a sparse run is not a smooth line)

_LOCK = threading.Lock()

# A tick step per time unit, smallest first: the first that gives at most 6 intervals is used.
_UNITS = (  # (window at most, unit seconds, suffix, steps)
    (120.0, 1.0, "s", (5, 10, 15, 20, 30, 60)),
    (2 * 3600.0, 60.0, "m", (1, 2, 5, 10, 15, 20, 30, 60)),
    (3 * 86400.0, 3600.0, "h", (1, 2, 3, 4, 6, 12, 24)),
    (math.inf, 86400.0, "d", (1, 2, 5, 7, 14, 30, 60, 90)),
)


def chart(run: str, points: Sequence[Point], *, metric: str, now: float, window: float,
          incidents: Sequence[float] = ()) -> bytes:
    """PNG bytes: the run's `metric` ("loss", "rate" or "gpus") over the `window` seconds before `now`.

    Restarts (where a point's segment changes) are dashed grey lines, incidents (opening times) red
    ones. Values that are not finite, or absurd, are left out; with nothing to draw, the picture says so.
    """
    if metric not in METRICS:
        raise ValueError(f"metric is one of {', '.join(METRICS)}, not {metric!r}")
    window = window if _real(window) and window > 0 else DEFAULT_WINDOW_S
    start = now - window
    pts = sorted((p for p in points if _real(p.t) and start <= p.t <= now + 1.0), key=lambda p: p.t)
    span = span_words(window)

    import matplotlib  # noqa: PLC0415 - only charts need it

    matplotlib.use("Agg")
    from matplotlib.figure import Figure  # noqa: PLC0415

    with _LOCK, matplotlib.rc_context(_STYLE):
        fig = Figure(figsize=(WIDTH_IN, HEIGHT_IN), dpi=DPI, layout="constrained")
        if not points:
            _message(fig, f"no history yet for {run}")
        elif metric == "gpus":
            _gpus(fig, run, pts, now, window, span)
        else:
            _single(fig, run, pts, metric, now, window, span)
        if fig.axes:
            _marks(fig.axes, pts, [t for t in incidents if _real(t) and start <= t <= now], now, window)
        out = io.BytesIO()
        fig.savefig(out, format="png", dpi=DPI, metadata={"Software": None})
    return out.getvalue()


_STYLE = {
    "font.size": 15,
    "axes.titlesize": 18,
    "axes.labelsize": 15,
    "xtick.labelsize": 14,
    "ytick.labelsize": 14,
    "legend.fontsize": 13,
    "axes.spines.top": False,
    "axes.spines.right": False,
    "axes.grid": True,
    "grid.alpha": 0.3,
    "lines.linewidth": 2.0,
    "figure.facecolor": "white",
    "axes.facecolor": "white",
    "text.usetex": False,
}


# -- the panels ---------------------------------------------------------------------------------


def _single(fig, run: str, pts: list[Point], metric: str, now: float, window: float, span: str) -> None:
    if metric == "loss":
        series = [(p.t, p.loss, p.segment) for p in pts if _real(p.loss)]
        unit, label = None, "loss"
    else:
        rated = [p for p in pts if _real(p.rate) and p.rate >= 0]
        unit = rated[-1].unit if rated else None  # the newest unit: it/s and tok/s on one axis would lie
        series = [(p.t, p.rate, p.segment) for p in rated if p.unit == unit]
        label = f"rate ({unit})" if unit else "rate"
    if not series:
        _message(fig, f"no {metric} for {run} in the last {span}", title=f"{run} — {label}")
        return
    ax = fig.add_subplot(1, 1, 1)
    last = series[-1][1]
    shown = humanize.count(last) + (f" {unit}" if unit else "") if metric == "rate" else humanize.number(last)
    ax.set_title(_plain(f"{run} — {label}, last {span}"), loc="left", fontweight="bold")
    ax.set_title(_plain(f"latest {shown}"), loc="right", color="#333333")
    _line(ax, series, PALETTE[0] if metric == "loss" else PALETTE[2], now, window, None)
    if metric == "rate":
        _compact_y(ax)
        ax.set_ylim(bottom=0)
    _time_axis(ax, window)


def _gpus(fig, run: str, pts: list[Point], now: float, window: float, span: str) -> None:
    roles: dict[str, tuple[list, list]] = {}
    for p in pts:
        for g in p.gpus:
            busy, mem = roles.setdefault(str(g.role), ([], []))
            if _real(g.busy) and -1e-9 <= g.busy <= 1 + 1e-9:
                busy.append((p.t, min(1.0, max(0.0, g.busy)) * 100, p.segment))
            if _real(g.mem_gib) and g.mem_gib >= 0:
                mem.append((p.t, g.mem_gib, p.segment))
    if not any(b or m for b, m in roles.values()):
        _message(fig, f"no GPU readings for {run} in the last {span}", title=f"{run} — GPUs")
        return
    top, bottom = fig.subplots(2, 1, sharex=True)
    top.set_title(_plain(f"{run} — GPUs by role, last {span}"), loc="left", fontweight="bold")
    for n, (role, (busy, mem)) in enumerate(roles.items()):
        colour = PALETTE[n % len(PALETTE)]
        if busy:
            _line(top, _binned(busy, now - window, window / BUSY_BINS), colour, now, window, _plain(role))
        if mem:
            _line(bottom, mem, colour, now, window, None if busy else _plain(role))
    top.set_ylabel("busy %")
    top.set_ylim(-3, 105)
    top.set_yticks([0, 50, 100])
    bottom.set_ylabel("GiB held")
    bottom.set_ylim(bottom=0)
    _compact_y(bottom)
    handles, _ = top.get_legend_handles_labels()
    more, _ = bottom.get_legend_handles_labels()
    if handles or more:
        top.legend(handles=handles + more, loc="upper left", bbox_to_anchor=(1.0, 1.0), frameon=False,
                   borderaxespad=0.3, handlelength=1.2)
    top.tick_params(labelbottom=False)
    _time_axis(bottom, window)


def _line(ax, series: list[tuple[float, float, int]], colour: str, now: float, window: float,
          label: str | None) -> None:
    """One series as a line broken at restarts and at long gaps (no straight line across hours unseen)."""
    xs, ys = [], []
    gaps = sorted(b[0] - a[0] for a, b in zip(series, series[1:]))
    typical = gaps[len(gaps) // 2] if gaps else 0.0
    longest = max(window / 24, 10 * typical)
    lone_x, lone_y = [], []
    piece: list[tuple[float, float]] = []

    def close() -> None:
        if len(piece) == 1:
            lone_x.append(piece[0][0])
            lone_y.append(piece[0][1])
        elif piece:
            if xs:
                xs.append(math.nan)
                ys.append(math.nan)
            xs.extend(x for x, _ in piece)
            ys.extend(y for _, y in piece)
        piece.clear()

    previous = None
    for t, y, segment in series:
        if previous is not None and (segment != previous[2] or t - previous[0] > longest):
            close()
        piece.append((t - now, y))
        previous = (t, y, segment)
    close()
    dots = len(series) <= MARKERS_UP_TO
    if xs:
        ax.plot(xs, ys, color=colour, label=label, marker="o" if dots else None, markersize=4,
                linewidth=2.0 if len(series) < 2000 else 1.2)
        label = None
    if lone_x:
        ax.plot(lone_x, lone_y, linestyle="none", marker="o", markersize=5, color=colour, label=label)


def _binned(series: list[tuple[float, float, int]], start: float, width: float) -> list[tuple[float, float, int]]:
    """The mean of each `width`-second slice (within one segment), when the series has more points than slices."""
    if len(series) <= 1.5 * BUSY_BINS or width <= 0:
        return series
    out = []
    for (segment, _), group in itertools.groupby(series, key=lambda p: (p[2], int((p[0] - start) // width))):
        rows = list(group)
        out.append((sum(r[0] for r in rows) / len(rows), sum(r[1] for r in rows) / len(rows), segment))
    return out


def _marks(axes, pts: list[Point], incidents: list[float], now: float, window: float) -> None:
    """Restarts as dashed grey lines with a small label (on the top panel), incidents as red lines."""
    restarts = [b.t for a, b in zip(pts, pts[1:]) if b.segment != a.segment]
    for ax in axes:
        for t in restarts:
            ax.axvline(t - now, color=RESTART, linestyle="--", linewidth=1.3, zorder=1)
        for t in incidents:
            ax.axvline(t - now, color=INCIDENT, linestyle="-", linewidth=2.0, alpha=0.85, zorder=1)
    labelled = -math.inf
    for t in restarts:
        if t - labelled < window / 12:  # labels that would overlap: the dashed line says it already
            continue
        labelled = t
        axes[0].annotate("restart", xy=(t - now, 1.0), xycoords=("data", "axes fraction"), xytext=(3, -2),
                         textcoords="offset points", ha="left", va="top", fontsize=11, color=RESTART,
                         bbox={"facecolor": "white", "edgecolor": "none", "alpha": 0.8, "pad": 1})
    if incidents:
        axes[-1].annotate("red: alert", xy=(1.0, 0.0), xycoords="axes fraction", xytext=(0, 3),
                          textcoords="offset points", ha="right", va="bottom", fontsize=11, color=INCIDENT)


def _message(fig, text: str, *, title: str | None = None) -> None:
    if title:
        fig.suptitle(_plain(title), x=0.02, ha="left", fontsize=18, fontweight="bold")
    fig.text(0.5, 0.5, _plain(text), ha="center", va="center", fontsize=20, color="#444444")


def span_words(window: float) -> str:
    """A window as the title says it: "6 h", "24 h", "1 h 30 min", "7 d" (hours up to two days, as people say)."""
    if window <= 48 * 3600 and window >= 3600 and window % 3600 == 0:
        return f"{int(window // 3600)} h"
    return humanize.duration(window)


# -- axes ---------------------------------------------------------------------------------------


def _time_axis(ax, window: float) -> None:
    """x is seconds relative to now: ticks at round steps back from now, labelled "−6h" … "now"."""
    ax.set_xlim(-window, 0)
    unit, suffix, steps = next((u, s, st) for limit, u, s, st in _UNITS if window <= limit)
    step = next((s for s in steps if window / (s * unit) <= 6), steps[-1])
    count = int(window // (step * unit))
    ticks = [-(k * step * unit) for k in range(count, -1, -1)]
    ax.set_xticks(ticks)
    ax.set_xticklabels([_ago(-t, unit, suffix) for t in ticks])


def _ago(seconds: float, unit: float, suffix: str) -> str:
    if seconds <= 0:
        return "now"
    n = seconds / unit
    return f"\u2212{n:.0f}{suffix}" if abs(n - round(n)) < 1e-9 else f"\u2212{n:.1f}{suffix}"


def _compact_y(ax) -> None:
    from matplotlib.ticker import FuncFormatter  # noqa: PLC0415

    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: humanize.count(v) if v else "0"))


# -- values -------------------------------------------------------------------------------------


def _real(x: object) -> bool:
    """A number worth drawing: finite and not absurd (bools and strings are not numbers here)."""
    if isinstance(x, bool) or not isinstance(x, (int, float)):
        return False
    try:
        return math.isfinite(x) and abs(x) < ABSURD
    except (OverflowError, TypeError):
        return False


def _plain(text: str) -> str:
    """Text shown as written: a `$` would otherwise start matplotlib's math mode."""
    return str(text).replace("$", r"\$")
