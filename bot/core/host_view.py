"""Pure: the Proxmox host's own view — its CTs, the training processes in each, and which CT holds each GPU."""

from __future__ import annotations

import enum
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from bot.core.sections import split_sections

# What the host script asks nvidia-smi (the same columns as the captures in tests/fixtures/gpu-utilization).
HOST_GPU_QUERY = ("index", "pci.bus_id", "uuid", "memory.used", "memory.total", "utilization.gpu")
APPS_QUERY = ("pid", "gpu_uuid", "used_memory")

# What the host probe reads at most. A CT's root controls what its scan prints (its bash, ps, paths), so the
# host cuts each CT's answer before it leaves the node, and the bot stops reading the whole answer past a bound.
CT_BYTES = 1 << 20  # one CT's answer: a real scan is a few KiB (a line per process, one per file it writes)
CT_MIN_BYTES = 64 << 10  # ...and never less, however many CTs share CTS_BYTES
CTS_BYTES = 8 << 20  # all CTs' answers together: each gets CTS_BYTES / running CTs, within the two above
CT_LINES = 20_000
APPS_MAX = 4096  # compute processes read (and cgroups looked up); the driver runs far fewer per GPU
HOST_ANSWER_BYTES = 16 << 20  # the whole answer, as the bot reads it: the host's caps stay inside (to 256 CTs)
PATH_MAX = 4096  # a longer "path" is no path the kernel gave
ARGS_MAX = 4096  # characters of a command line kept (a line shows far fewer, redacted first)

# /lxc/<vmid>/ is Proxmox's cgroup for a CT (v2 `0::/lxc/200/ns/…`, v1 `4:memory:/lxc/200`); LXC 4+ without
# Proxmox's layout names it lxc.payload.<vmid>. `lxc.monitor.<vmid>` is LXC's own monitor, not the CT.
_LXC = re.compile(r"(?:^|/)lxc/(\d+)(?=/|$)|(?:^|/)lxc\.payload\.(\d+)(?=/|$)")
_CT_HEAD = re.compile(rb"(\d+) rc=(\d+) len=(\d+) cut=(-|bytes:\d+|lines:\d+)")
_LOG_NAME = re.compile(r"\.(?:log|out|txt|err)(?:\.\d+)?$", re.I)


class Smi(enum.Enum):
    """How nvidia-smi on the host answered."""

    OK = "ok"
    MISSING = "missing"  # no nvidia-smi on the host: not a GPU box, or the driver lives elsewhere
    FAILED = "failed"  # it ran and failed (no driver loaded, insufficient permissions)


@dataclass(frozen=True)
class Container:
    """One line of `pct list`."""

    vmid: int
    status: str
    name: str


@dataclass(frozen=True)
class HostGpu:
    index: int
    bus_id: str
    uuid: str
    used_mib: float | None
    total_mib: float | None
    util: float | None  # the instantaneous utilization.gpu reading, percent


@dataclass(frozen=True)
class GpuApp:
    """One compute process on a GPU, as the driver reports it (a host PID), and the CT its cgroup names."""

    pid: int
    uuid: str
    used_mib: float | None
    vmid: int | None = None  # None: the host itself, or a cgroup runbot could not read


@dataclass(frozen=True)
class Proc:
    """A process inside a CT that looks like training, and the regular files it holds open for writing."""

    pid: int
    elapsed_s: int | None
    args: str
    files: tuple[tuple[int, str], ...] = ()  # (fd, path inside the CT)


class Unit(enum.Enum):
    BYTES = "bytes"
    LINES = "lines"


@dataclass(frozen=True)
class Cut:
    """Where the host cut an answer: after `limit` bytes or lines; what came after was never read."""

    unit: Unit
    limit: int


@dataclass(frozen=True)
class CtScan:
    vmid: int
    procs: tuple[Proc, ...] = ()
    error: str | None = None  # `pct exec` failed: its rc and what it said, as a sentence
    cut: Cut | None = None  # the CT printed more than its share: only the lines before the cut were read


@dataclass(frozen=True)
class HostView:
    """Everything one host probe saw. `failure`: the probe did not run at all (a sentence naming the host)."""

    host: str
    containers: tuple[Container, ...] = ()
    pct_error: str | None = None
    gpus: tuple[HostGpu, ...] = ()
    apps: tuple[GpuApp, ...] = ()
    smi: Smi = Smi.OK
    smi_error: str | None = None
    scans: Mapping[int, CtScan] = field(default_factory=dict)
    failure: str | None = None
    failure_kind: str | None = None
    apps_cut: bool = False  # nvidia-smi listed more than APPS_MAX compute processes: the rest were not read
    cut: int | None = None  # the whole answer passed this many bytes: the bot read no further

    def index_of(self, uuid: str) -> int | None:
        return next((g.index for g in self.gpus if g.uuid == uuid), None)

    def gpu(self, index: int) -> HostGpu | None:
        return next((g for g in self.gpus if g.index == index), None)


@dataclass(frozen=True)
class Holder:
    """Who holds a GPU: a CT (None: the host itself) and the memory its processes use there."""

    vmid: int | None
    used_mib: float | None
    pids: tuple[int, ...]


# -- parsing the pieces ---------------------------------------------------------------------


def parse_pct_list(text: str) -> tuple[Container, ...]:
    """`pct list`: a header, then `VMID Status [Lock] Name` (Lock is often blank, so Name is the last word)."""
    out = []
    for line in text.splitlines():
        words = line.split()
        if len(words) >= 2 and words[0].isdigit():
            out.append(Container(int(words[0]), words[1], words[-1] if len(words) >= 3 else ""))
    return tuple(out)


def _number(text: str) -> float | None:
    try:
        return float(text)
    except ValueError:
        return None  # "[N/A]", "[Not Supported]"


def parse_gpus(text: str) -> tuple[HostGpu, ...]:
    """Rows of `--query-gpu=index,pci.bus_id,uuid,memory.used,memory.total,utilization.gpu` (noheader, nounits)."""
    out = []
    for line in text.splitlines():
        cols = [c.strip() for c in line.split(",")]
        if len(cols) != len(HOST_GPU_QUERY) or not cols[0].isdigit():
            continue
        out.append(HostGpu(int(cols[0]), cols[1], cols[2], _number(cols[3]), _number(cols[4]), _number(cols[5])))
    return tuple(out)


def parse_apps(text: str) -> tuple[GpuApp, ...]:
    """Rows of `--query-compute-apps=pid,gpu_uuid,used_memory` (noheader, nounits); other lines are ignored.
    At most APPS_MAX rows (the host script sends one more, to say there were more)."""
    out = []
    for line in text.splitlines():
        cols = [c.strip() for c in line.split(",")]
        if len(cols) == 3 and cols[0].isdigit() and cols[1].startswith(("GPU-", "MIG-")):
            out.append(GpuApp(int(cols[0]), cols[1], _number(cols[2])))
    return tuple(out[:APPS_MAX])


def _apps_cut(text: str) -> bool:
    return len(text.splitlines()) > APPS_MAX


def ct_of_cgroup(text: str) -> int | None:
    """The CT a process belongs to, from its /proc/PID/cgroup (any hierarchy naming one); None: not in a CT.
    Below /lxc/<vmid>/ns/ the CT's root names the cgroups: the first match, Proxmox's own, is the CT."""
    for line in text.split("\n"):
        _, _, path = line.partition(":")
        _, _, path = path.partition(":")
        if (m := _LXC.search(path)) is not None:
            return int(m[1] or m[2])
    return None


def parse_cgroups(text: str) -> dict[int, int | None]:
    """The host script's `# pid N` blocks, each followed by that process's /proc/PID/cgroup. The first block of a
    PID is its own: the host prints each once, in order, and only cgroup lines that hold `lxc`."""
    out: dict[int, int | None] = {}
    for block in ("\n" + text).split("\n# pid ")[1:]:
        head, _, body = block.partition("\n")
        if head.strip().isdigit():
            out.setdefault(int(head), ct_of_cgroup(body))
    return out


def parse_scans(raw: bytes, nonce: str) -> dict[int, CtScan]:
    """The `cts` section: per running CT a header the host wrote, `@@CT:<nonce>@@ VMID rc=N len=L cut=C`, then
    exactly L bytes of that CT's answer, read as that CT's alone whatever they hold: `p PID ETIMES ARGS` and
    `f PID FD PATH` (tab-separated) lines, and anything else `pct exec` or the CT said."""
    out: dict[int, CtScan] = {}
    head = f"@@CT:{nonce}@@ ".encode()
    at = raw.find(head)
    while at != -1:
        eol = raw.find(b"\n", at)
        m = _CT_HEAD.fullmatch(raw, at + len(head), eol) if eol != -1 else None
        if m is None:  # not a header the host finished writing: the answer ends here
            break
        start, length = eol + 1, int(m[3])
        body = raw[start:start + length]
        at = raw.find(head, start + length)
        if len(body) < length:
            break  # the bot stopped reading inside this CT's answer (HostView.cut says so)
        vmid = int(m[1])
        if vmid not in out:
            out[vmid] = _scan(vmid, int(m[2]), _cut(m[4].decode()), body.decode("utf-8", "replace"))
    return out


def _cut(text: str) -> Cut | None:
    unit, _, limit = text.partition(":")
    return None if text == "-" else Cut(Unit(unit), int(limit))


def _scan(vmid: int, rc: int, cut: Cut | None, text: str) -> CtScan:
    procs: dict[int, Proc] = {}
    files: dict[int, list[tuple[int, str]]] = {}
    said = []
    for line in text.split("\n"):  # not splitlines(): a CT's U+2028 or NEL is inside its line, not a break
        kind, _, rest = line.partition("\t")
        if kind == "p":
            pid, _, rest = rest.partition("\t")
            etimes, _, args = rest.partition("\t")
            if pid.isdigit():
                procs[int(pid)] = Proc(int(pid), int(etimes) if etimes.isdigit() else None, args.strip()[:ARGS_MAX])
        elif kind == "f":
            pid, _, rest = rest.partition("\t")
            fd, _, path = rest.partition("\t")
            if pid.isdigit() and fd.isdigit() and path.startswith("/") and len(path.encode()) <= PATH_MAX:
                files.setdefault(int(pid), []).append((int(fd), path))
        elif len(said) < 5:
            said.append(line[:ARGS_MAX])
    error = None
    if rc != 0 and cut is None:  # a cut answer's `pct exec` was stopped by the cut: that is what to say
        error = _failed(f"pct exec {vmid}", rc, " ".join(said))
    return CtScan(vmid, tuple(Proc(p.pid, p.elapsed_s, p.args, tuple(files.get(p.pid, ()))) for p in procs.values()),
                  error, cut)


def host_view_from_output(host: str, stdout: bytes, nonce: str, *, cut: int | None = None) -> HostView:
    """The host script's output as a HostView (never raises, whatever the bytes); `cut`: the bot stopped
    reading it after that many bytes."""
    s = split_sections(stdout, nonce)
    pct_rc = s.rc("pct")
    containers = parse_pct_list(s.text("pct"))
    pct_error = None if pct_rc in (0, None) else _failed("pct list", pct_rc, s.text("pct.err") or s.text("pct"))
    gpus_text, apps_text = s.text("gpus"), s.text("apps")
    apps_cut = _apps_cut(apps_text)
    smi, smi_error = Smi.OK, None
    if gpus_text.strip() == "@missing":
        smi = Smi.MISSING
    elif s.rc("gpus") not in (0, None):
        smi, smi_error = Smi.FAILED, _failed("nvidia-smi", s.rc("gpus"), s.text("gpus.err") or gpus_text)
    elif s.rc("apps") not in (0, None) and not apps_cut:  # cut: its exit is the cut's SIGPIPE
        smi, smi_error = Smi.FAILED, _failed("nvidia-smi --query-compute-apps", s.rc("apps"),
                                             s.text("apps.err") or apps_text)
    cts = parse_cgroups(s.text("cgroups"))
    apps = tuple(GpuApp(a.pid, a.uuid, a.used_mib, cts.get(a.pid)) for a in parse_apps(apps_text))
    return HostView(host, containers, pct_error, parse_gpus(gpus_text) if smi is Smi.OK else (), apps, smi,
                    smi_error, parse_scans(s.get("cts") or b"", nonce), apps_cut=apps_cut, cut=cut)


def _failed(what: str, rc: int | None, said: str) -> str:
    """A sentence; what the tool said kept long enough to redact whole (the renderers redact, then cut)."""
    said = " ".join(said.split())[:2000]
    return f"{what} failed (exit {rc})" + (f": {said}" if said else "")


# -- what the view says ---------------------------------------------------------------------


def holders(view: HostView) -> dict[int, list[Holder]]:
    """GPU index -> who holds it, one Holder per CT (its processes' memory summed), most memory first."""
    per: dict[int, dict[int | None, list[GpuApp]]] = {}
    for app in view.apps:
        index = view.index_of(app.uuid)
        if index is not None:
            per.setdefault(index, {}).setdefault(app.vmid, []).append(app)
    out: dict[int, list[Holder]] = {}
    for index, by_ct in per.items():
        rows = []
        for vmid, apps in by_ct.items():
            used = [a.used_mib for a in apps if a.used_mib is not None]
            rows.append(Holder(vmid, sum(used) if used else None, tuple(a.pid for a in apps)))
        out[index] = sorted(rows, key=lambda h: -(h.used_mib or 0))
    return out


def gpus_of(view: HostView, vmid: int) -> tuple[int, ...]:
    """The GPU indices a CT's processes are on."""
    return tuple(sorted(i for i, hs in holders(view).items() if any(h.vmid == vmid for h in hs)))


@dataclass(frozen=True)
class Found:
    """A run discovery found: a CT, the log its training writes, the GPUs it uses, and the run already naming it."""

    name: str
    vmid: int
    log: str | None
    others: tuple[str, ...]  # other files its training holds open for writing
    args: str
    gpus: tuple[int, ...]
    configured_as: str | None


def choose_log(files: Iterable[tuple[int, str]]) -> tuple[str | None, tuple[str, ...]]:
    """The log among the files training holds open for writing: stdout/stderr redirected to a file first,
    then a name that reads like a log; the rest (checkpoints, metrics) are listed, not chosen."""
    paths: list[str] = []
    for _, path in sorted(files, key=lambda f: (f[0] not in (1, 2), not _LOG_NAME.search(f[1]), f[0])):
        if path not in paths:
            paths.append(path)
    return (paths[0], tuple(paths[1:])) if paths else (None, ())


def run_name(ct_name: str, vmid: int, taken: set[str]) -> str:
    """A run name from the CT's name (valid as a config key), made unique among `taken`."""
    base = re.sub(r"[^A-Za-z0-9_.-]+", "-", ct_name).strip("-._")[:56] or f"ct{vmid}"
    name, n = base, 2
    while name.casefold() in taken:
        name, n = f"{base}-{n}", n + 1
    taken.add(name.casefold())
    return name


def discovered(view: HostView, configured: Sequence[tuple[str, str, int | None, str]]) -> list[Found]:
    """Runs found on the host, one per (CT, log); `configured` is (name, host, container, log) of each
    configured run, so that those already in the config are marked, and their names are not reused."""
    names = {c.vmid: c.name for c in view.containers}
    taken = {name.casefold() for name, *_ in configured}
    out = []
    for vmid, scan in sorted(view.scans.items()):
        by_log: dict[str | None, tuple[Proc, tuple[str, ...]]] = {}
        for proc in scan.procs:
            log, others = choose_log(proc.files)
            if log is None and not _is_launcher(proc):
                continue  # a python that writes no file and is not a launcher: a daemon, not training
            by_log.setdefault(log, (proc, others))
        for log, (proc, others) in by_log.items():
            if log is None and len(by_log) > 1:
                continue  # the launcher of workers whose log was found
            same = next((n for n, h, ct, lg in configured if h == view.host and ct == vmid and (log is None or lg == log)),
                        None)
            out.append(Found(same or run_name(names.get(vmid, ""), vmid, taken), vmid, log, others, proc.args,
                             gpus_of(view, vmid), same))
    return out


def _is_launcher(proc: Proc) -> bool:
    return bool(re.search(r"(?:^|/)(?:torchrun|deepspeed|accelerate)(?:\s|$)", proc.args))


def runs_by_ct(runs: Iterable[object], host: str) -> dict[int, list[str]]:
    """CT id -> the names of the given runs (objects with name, host, container) that live in it on `host`."""
    out: dict[int, list[str]] = {}
    for run in runs:
        if getattr(run, "host") == host and getattr(run, "container") is not None:
            out.setdefault(getattr(run, "container"), []).append(getattr(run, "name"))
    return out
