"""Pure: the host's view in words — who holds a run's GPUs, the whole box, and discovery's `[runs.NAME]` blocks.

Plain text; the Slack renderer escapes it (bot.render.slack.host_message) and the terminal prints it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence, Set

from bot.core import humanize as hz
from bot.core.host_view import Found, Holder, HostView, Smi, holders

RunsByCt = Mapping[int, Sequence[str]]  # CT id -> the configured runs (the caller may see) living in it


def view_off(host: str) -> str:
    return (f"host view: off for {host} (set host_view = true under [hosts.{host}] to see which CT holds each GPU)")


def view_problem(view: HostView) -> str | None:
    """One line when the host view could not say who holds the GPUs: not permitted, unreachable, no driver."""
    if view.failure is not None:
        what = "not permitted" if view.failure_kind in ("auth", "hostkey") else "failed"
        return f"host view {what} on {view.host}: {view.failure}"
    if view.smi is Smi.MISSING:
        return f"host view: no nvidia-smi on {view.host} itself (outside the CTs)"
    if view.smi is Smi.FAILED:
        said = view.smi_error or "nvidia-smi failed"
        what = "not permitted" if "permission" in said.lower() else "failed"
        return f"host view {what} on {view.host}: {said}"
    return None


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
    return lines


def _indices(indices: Iterable[int]) -> str:
    return ", ".join(str(i) for i in indices) or "no GPUs"


def host_lines(view: HostView, runs: RunsByCt) -> list[str]:
    """The whole box: every GPU with its holders, memory and utilisation, then the CTs `pct list` shows."""
    running = [c for c in view.containers if c.status == "running"]
    head = f"{view.host}: {len(view.gpus)} GPUs · {len(running)} of {len(view.containers)} CTs running"
    problem = view_problem(view)
    lines = [head] + ([problem] if problem else [])
    if view.pct_error:
        lines.append(f"! {view.pct_error}")
    held = holders(view)
    for g in view.gpus:
        mem = "mem ?" if g.used_mib is None else hz.gib(g.used_mib, *((g.total_mib,) if g.total_mib else ()))
        util = "util ?" if g.util is None else f"util {g.util:.0f} %"
        who = ", ".join(_holder(h, runs) for h in held.get(g.index, [])) or "free"
        lines.append(f"GPU {g.index}: {mem:<12} {util:<10} {who}")
    return lines


def toml_string(text: str) -> str:
    """A TOML basic string: quotes, backslashes and control characters escaped (a path may hold any of them)."""
    out = []
    for ch in text:
        if ch in '"\\':
            out.append("\\" + ch)
        elif ord(ch) < 0x20 or ord(ch) == 0x7F:
            out.append(f"\\u{ord(ch):04X}")
        else:
            out.append(ch)
    return '"' + "".join(out) + '"'


def discover_lines(view: HostView, found: Sequence[Found], *, visible: Set[str] | None = None) -> list[str]:
    """Ready-to-paste `[runs.NAME]` blocks for what is new, one comment line for what is configured already
    (naming the run only when it is among `visible`, None: all; a run the asker may not see stays unnamed)."""
    if view.failure is not None:
        return [f"# {view.host}: {view.failure}"]
    running = [c for c in view.containers if c.status == "running"]
    new = [f for f in found if f.configured_as is None]
    lines = [f"# {view.host}: {len(running)} running CTs, {len(found)} runs found, {len(new)} not in the config "
             "(runbot never edits it: paste what you want into runs.toml)"]
    if view.pct_error:
        lines.append(f"# {view.pct_error}")
    if (problem := view_problem(view)) is not None:
        lines.append(f"# {problem} (GPU indices left out)")
    for f in found:
        if f.configured_as is not None and (visible is None or f.configured_as in visible):
            lines.append(f"# already configured as [runs.{f.configured_as}]: CT {f.vmid} · {f.log or '?'}")
        elif f.configured_as is not None:
            lines.append(f"# CT {f.vmid}: already configured")
    names = {c.vmid: c.name for c in view.containers}
    for f in new:
        lines += ["", f"[runs.{f.name}]  # CT {f.vmid} {names.get(f.vmid, '')}: {' '.join(f.args.split())[:120]}",
                  f"host = {toml_string(view.host)}", f"container = {f.vmid}"]
        if f.log is None:
            lines.append('log = ""  # it holds no file open for writing: say where it logs')
        else:
            lines.append(f"log = {toml_string(f.log)}")
        if f.gpus:
            lines.append(f"gpus = {{ train = [{', '.join(map(str, f.gpus))}] }}")
        lines += [f"# also written: {toml_string(o)}" for o in f.others[:5]]
    seen = {f.vmid for f in found}
    for c in running:
        scan = view.scans.get(c.vmid)
        if scan is not None and scan.error:
            lines.append(f"# CT {c.vmid} {c.name}: {scan.error}")
        elif c.vmid not in seen:
            lines.append(f"# CT {c.vmid} {c.name}: no training process found")
    return lines
