"""Pure: a Verdict as a monitoring plugin's answer (`runbot status RUN --check`): an exit code and one line with perfdata."""

from __future__ import annotations

from decimal import Decimal

from bot.core.history import role_loads
from bot.core.redact import clean_line
from bot.core.verdict import Level, Verdict
from bot.render.machine import number

# The Monitoring Plugins' exit codes (Nagios, Icinga, Sensu, Checkmk and cron wrappers read only these).
OK, WARNING, CRITICAL, UNKNOWN = 0, 1, 2, 3
WORDS = {OK: "OK", WARNING: "WARN", CRITICAL: "CRIT", UNKNOWN: "UNKNOWN"}  # runbot's own level words
# NOTE (loading, saving, evaluating, compiling) is a run doing what runs do: a check that warned on it
# would page at every checkpoint (docs/decisions.md).
_BY_LEVEL = {Level.OK: OK, Level.NOTE: OK, Level.WARN: WARNING, Level.CRIT: CRITICAL}


def code(v: Verdict) -> int:
    """UNKNOWN when the run could not be reached (nothing was seen to judge); else its level."""
    return UNKNOWN if not v.reached else _BY_LEVEL[v.level]


def check(v: Verdict) -> tuple[int, str]:
    """(exit code, "RUNBOT CRIT - <headline> | step=1200;;;0;50000 rate=14213;;;; loss=2.31;;;; age=4s;;;;")."""
    status = code(v)
    perf = perfdata(v)
    return status, f"RUNBOT {WORDS[status]} - {_one_line(v.headline)}" + (f" | {perf}" if perf else "")


def unknown(why: str) -> str:
    """The line for a check that could not even probe (a bad config, an unknown run): UNKNOWN, exit 3."""
    return f"RUNBOT UNKNOWN - {_one_line(why)}"


def perfdata(v: Verdict) -> str:
    """The plugin guidelines' `'label'=value[UOM];[warn];[crit];[min];[max]` for each number runbot read;
    a number it did not read is left out, never written as 0. Labels are fixed words or configured roles."""
    items: list[tuple[str, float | int | None, str, str, str]] = []  # label, value, unit, min, max
    step = v.step
    if step is not None:
        total = step.total if step.total is not None and step.step is not None and step.total >= step.step else None
        items += [("step", step.step, "", "0" if total is not None else "", _number(total)),
                  ("rate", number(step.rate), "", "", ""), ("loss", number(step.loss), "", "", "")]
    if v.progress_age is not None:
        items.append(("age", round(v.progress_age, 1), "s", "", ""))
    items += [(f"busy_{load.role}", round(load.busy * 100, 1), "%", "0", "100") for load in role_loads(v.gpu)]
    return " ".join(f"{_label(label)}={_number(value)}{unit};;;{lo};{hi}" for label, value, unit, lo, hi in items
                    if value is not None)


def _number(x: float | int | None) -> str:
    """Positional notation (perfdata has no exponent): 1e-07 -> "0.0000001", 14213.0 -> "14213"."""
    if x is None:
        return ""
    text = format(Decimal(repr(x)), "f")
    return text.rstrip("0").rstrip(".") if "." in text else text


def _label(label: str) -> str:
    """Quoted when it holds a space or a quote or an equals sign (the guidelines' rule); a ' inside doubled."""
    return f"'{label.replace(chr(39), chr(39) * 2)}'" if any(c in label for c in " '=") else label


def _one_line(headline: str) -> str:
    """The headline safe to print as a plugin's output: one line, redacted, and no `|`, which starts perfdata."""
    return " ".join(clean_line(headline).replace("|", "/").split())
