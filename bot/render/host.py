"""Pure: the host's view in words — who holds a run's GPUs, the whole box, and discovery's `[runs.NAME]` blocks.

Plain text, every line printable and bounded, what a host or CT said redacted before it is cut: the terminal
prints it as it is, and the Slack renderer escapes it (bot.render.slack.host_message, discover_message).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence, Set

from bot.core import humanize as hz
from bot.core.host_view import APPS_MAX, Found, Holder, HostView, Smi, Unit, holders
from bot.core.redact import clean_line, redact_secrets

RunsByCt = Mapping[int, Sequence[str]]  # CT id -> the configured runs (the caller may see) living in it


SAID_CHARS = 300  # what a host or CT said (an error, a command line), after redaction
ARGS_CHARS = 120  # a command line beside its [runs.NAME] block
NAME_CHARS = 64  # a CT's name (Proxmox allows 63 characters; a tenant may set anything)
_BARE_KEY = re.compile(r"[A-Za-z0-9_-]+")


def _shown(text: str, limit: int = SAID_CHARS) -> str:
    """Text a host or CT sent, as one line: printable, redacted, then squashed and cut."""
    return hz.trim(clean_line(text), limit)


def view_off(host: str) -> str:
    return (f"host view: off for {host} (set host_view = true under [hosts.{host}] to see which CT holds each GPU)")


def view_problem(view: HostView) -> str | None:
    """One line when the host view could not say who holds the GPUs: not permitted, unreachable, no driver."""
    if view.failure is not None:
        what = "not permitted" if view.failure_kind in ("auth", "hostkey") else "failed"
        return f"host view {what} on {view.host}: {_shown(view.failure)}"
    if view.smi is Smi.MISSING:
        return f"host view: no nvidia-smi on {view.host} itself (outside the CTs)"
    if view.smi is Smi.FAILED:
        said = view.smi_error or "nvidia-smi failed"
        what = "not permitted" if "permission" in said.lower() else "failed"
        return f"host view {what} on {view.host}: {_shown(said)}"
    return None


def _apps_cut(view: HostView) -> list[str]:
    if not view.apps_cut:
        return []
    return [f"(nvidia-smi on {view.host} lists over {APPS_MAX} compute processes: the first {APPS_MAX} are read)"]


def ct_label(vmid: int | None, runs: RunsByCt) -> str:
    """'CT 201 (run `eval-7b`)', 'CT 202', or 'the host itself' (a GPU process in no CT)."""
    if vmid is None:
        return "the host itself"
    names = runs.get(vmid, ())
    if not names:
        return f"CT {vmid}"
    return f"CT {vmid} (run{'s' if len(names) > 1 else ''} {', '.join(f'`{n}`' for n in names)})"


def _holder(h: Holder, runs: RunsByCt) -> str:
    label = ct_label(h.vmid, runs)
    mem = "" if h.used_mib is None else hz.gib(h.used_mib)
    if not mem:
        return label
    return f"{label[:-1]}, {mem})" if label.endswith(")") else f"{label} ({mem})"


def ownership(view: HostView, indices: Iterable[int], vmid: int | None, runs: RunsByCt) -> list[str]:
    """For a run's GPUs: who holds each, and a line for each GPU another CT also sits on."""
    problem = view_problem(view)
    if problem is not None:
        return [problem]
    held = holders(view)
    wanted = sorted(set(indices)) or sorted({i for i, hs in held.items() if any(h.vmid == vmid for h in hs)})
    if not wanted:
        return [f"host view: no GPU process of CT {vmid} on {view.host}"]
    lines = []
    for i in wanted:
        if view.gpu(i) is None:
            lines.append(f"GPU {i}: not on {view.host} (the host lists {_indices(g.index for g in view.gpus)})")
            continue
        hs = held.get(i, [])
        own = [h for h in hs if h.vmid == vmid and vmid is not None]
        others = [h for h in hs if h not in own]
        if not hs:
            lines.append(f"GPU {i}: no process holds it")
        elif own:
            lines.append(f"GPU {i}: held by {_holder(own[0], runs)}")
        for h in others:
            lines.append(f"GPU {i} is {'also ' if own else ''}used by {_holder(h, runs)}")
    return lines + _apps_cut(view)


def _indices(indices: Iterable[int]) -> str:
    return ", ".join(str(i) for i in indices) or "no GPUs"


def host_lines(view: HostView, runs: RunsByCt) -> list[str]:
    """The whole box: every GPU with its holders, memory and utilisation, then the CTs `pct list` shows."""
    running = [c for c in view.containers if c.status == "running"]
    head = f"{view.host}: {len(view.gpus)} GPUs · {len(running)} of {len(view.containers)} CTs running"
    problem = view_problem(view)
    lines = [head] + ([problem] if problem else [])
    if view.pct_error:
        lines.append(f"! {_shown(view.pct_error)}")
    lines += _apps_cut(view)
    held = holders(view)
    for g in view.gpus:
        mem = "mem ?" if g.used_mib is None else hz.gib(g.used_mib, *((g.total_mib,) if g.total_mib else ()))
        util = "util ?" if g.util is None else f"util {g.util:.0f} %"
        who = ", ".join(_holder(h, runs) for h in held.get(g.index, [])) or "free"
        lines.append(f"GPU {g.index}: {mem:<12} {util:<10} {who}")
    return lines


def toml_string(text: str) -> str:
    """A TOML basic string that shows what it holds: quotes and backslashes escaped, and as a \\u escape every
    character that is not printable (controls, C1, bidi, line separators) and the backtick (three would close
    Slack's code block): the value stays exact, and the line displays as it reads."""
    out = []
    for ch in text:
        if ch in '"\\':
            out.append("\\" + ch)
        elif ch.isprintable() and ch != "`":
            out.append(ch)
        else:
            out.append(f"\\u{ord(ch):04X}" if ord(ch) <= 0xFFFF else f"\\U{ord(ch):08X}")
    return '"' + "".join(out) + '"'


def toml_key(name: str) -> str:
    """A table name as TOML reads it back as one key: `train-7b` bare, `train.lab.example` quoted."""
    return name if _BARE_KEY.fullmatch(name) else toml_string(name)


def _clip(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[:limit - 1] + "…"


def _unusable(log: str | None) -> str | None:
    """Why a found log cannot go in the config as it is (None: it can): runbot's config refuses text that is not
    printable, and a path that redaction changed would name another file."""
    if log is None:
        return "it holds no file open for writing: say where it logs"
    if not log.isprintable():
        return "its log's path holds characters runbot's config refuses (shown escaped)"
    if redact_secrets(log) != log:
        return "its log's path looks like it holds a credential (shown redacted)"
    return None


def _cut_note(unit: Unit, limit: int) -> str:
    return f"answer cut at {hz.size(limit) if unit is Unit.BYTES else f'{limit} lines'}"


def discover_lines(view: HostView, found: Sequence[Found], *, visible: Set[str] | None = None) -> list[str]:
    """Ready-to-paste `[runs.NAME]` blocks for what is new, one comment line for what is configured already
    (naming the run only when it is among `visible`, None: all; a run the asker may not see stays unnamed).
    Pasted whole, the answer is a valid config: a block whose log cannot be configured as found comes commented
    out, with the reason; what a CT said is in comments, printable and redacted, its log line never cut."""
    if view.failure is not None:
        return [f"# {view.host}: {_shown(view.failure)}"]
    running = [c for c in view.containers if c.status == "running"]
    new = [f for f in found if f.configured_as is None]
    lines = [f"# {view.host}: {len(running)} running CTs, {len(found)} runs found, {len(new)} not in the config "
             "(runbot never edits it: paste what you want into runs.toml)"]
    if view.pct_error:
        lines.append(f"# {_shown(view.pct_error)}")
    if (problem := view_problem(view)) is not None:
        lines.append(f"# {problem} (GPU indices left out)")
    if view.cut is not None:
        lines.append(f"# the host's answer passed {hz.size(view.cut)}: runbot read no further")
    for f in found:
        if f.configured_as is not None and (visible is None or f.configured_as in visible):
            lines.append(f"# already configured as [runs.{toml_key(f.configured_as)}]: CT {f.vmid} · "
                         f"{_shown(f.log or '?')}")
        elif f.configured_as is not None:
            lines.append(f"# CT {f.vmid}: already configured")
    names = {c.vmid: _shown(c.name, NAME_CHARS) for c in view.containers}
    for f in new:
        why = _unusable(f.log)
        block = [f"[runs.{toml_key(f.name)}]  # CT {f.vmid} {names.get(f.vmid, '')}: {_shown(f.args, ARGS_CHARS)}",
                 f"host = {toml_string(view.host)}", f"container = {f.vmid}",
                 f"log = {toml_string(redact_secrets(f.log or ''))}"]
        if f.gpus:
            block.append(f"gpus = {{ train = [{', '.join(map(str, f.gpus))}] }}")
        if why is not None:  # commented out, so that pasting it all still makes a config runbot starts on
            block = [f"# ({why}; then uncomment)", *(f"# {line}" for line in block)]
        lines += ["", *block]
        lines += [f"# also written: {_clip(toml_string(redact_secrets(o)), SAID_CHARS)}" for o in f.others[:5]]
    seen = {f.vmid for f in found}
    for c in running:
        scan = view.scans.get(c.vmid)
        if scan is not None and scan.cut is not None:
            lines.append(f"# CT {c.vmid} {names[c.vmid]}: {_cut_note(scan.cut.unit, scan.cut.limit)} "
                         "(only what it printed before that was read)")
        elif scan is not None and scan.error:
            lines.append(f"# CT {c.vmid} {names[c.vmid]}: {_shown(scan.error)}")
        elif scan is None and view.cut is not None:
            lines.append(f"# CT {c.vmid} {names[c.vmid]}: not read (the answer was cut before it)")
        elif c.vmid not in seen:
            lines.append(f"# CT {c.vmid} {names[c.vmid]}: no training process found")
    return lines
