"""Pure: the probe's output grammar — sections cut at marker lines a log cannot forge (a fresh nonce each
probe), each part's exit status and stderr beside it."""

from __future__ import annotations

import re
from dataclasses import dataclass

LINE_CAP = 2000  # characters kept of one found line: bars can make one line of 100 MB
_NAME = re.compile(r"[a-z][a-z.]*\Z")


def marker(nonce: str) -> bytes:
    return f"\n@@RB:{nonce}@@ ".encode()


@dataclass(frozen=True)
class Sections:
    """A probe's output split by section name; missing sections are simply absent."""

    parts: dict[str, bytes]

    def get(self, name: str) -> bytes | None:
        return self.parts.get(name)

    def text(self, name: str, limit: int = 1 << 20) -> str:
        raw = self.parts.get(name) or b""
        return raw[:limit].decode("utf-8", "replace")

    def rc(self, name: str) -> int | None:
        raw = self.parts.get(f"{name}.rc")
        try:
            return int(raw.strip()) if raw is not None else None
        except ValueError:
            return None

    @property
    def complete(self) -> bool:
        return "end" in self.parts


def split_sections(stdout: bytes, nonce: str) -> Sections:
    """Cut the probe's stdout at its marker lines. Never raises, whatever the bytes."""
    parts: dict[str, bytes] = {}
    chunks = (b"\n" + stdout).split(marker(nonce))
    for chunk in chunks[1:]:
        name, _, body = chunk.partition(b"\n")
        key = name.decode("ascii", "replace").strip()
        if _NAME.match(key) and key not in parts:
            parts[key] = body
    return Sections(parts)


SHARED = frozenset({"gpu.window", "gpu.window.rc", "gpu.window.err", "gpus", "end"})  # read once for all a probe's runs
_RUN = re.compile(r"run (\d+)\Z")


def split_runs(stdout: bytes, nonce: str, count: int) -> list[Sections]:
    """A group probe's output as one Sections per run, in the order the script listed them: each run's own
    parts after its `run N` marker, and the parts all share (SHARED). Output without run markers (a probe
    saved by an older runbot) is one run's. A run the output never reached gets only the shared parts."""
    own: list[dict[str, bytes]] = [{} for _ in range(count)]
    shared: dict[str, bytes] = {}
    current: dict[str, bytes] | None = own[0] if count == 1 else None
    for chunk in (b"\n" + stdout).split(marker(nonce))[1:]:
        name, _, body = chunk.partition(b"\n")
        key = name.decode("ascii", "replace").strip()
        if (m := _RUN.match(key)) is not None:
            current = own[int(m[1])] if int(m[1]) < count else {}  # a run beyond those asked about: set aside
        elif _NAME.match(key):
            into = shared if key in SHARED or current is None else current
            into.setdefault(key, body)
    return [Sections({**shared, **parts}) for parts in own]


_NOW = re.compile(rb"^now=([0-9.]+)$", re.M)
_PS_LINE = re.compile(rb"^([ \t]*\d+[ \t]+)(\d+)([ \t])", re.M)  # `ps -o pid=,etimes=,args=`


def moved_on(sections: Sections, seconds: float) -> Sections:
    """The same probe read `seconds` later on the remote clock, as if nothing had changed since: the log,
    its writer and its lines as they were, only `now` later (what would runbot say if the run froze?)."""
    meta = sections.parts.get("meta")
    if not seconds or meta is None or not (m := _NOW.search(meta)):
        return sections
    later = f"now={float(m[1]) + seconds:.6f}".encode()
    parts = {**sections.parts, "meta": meta[:m.start()] + later + meta[m.end():]}
    for name in ("writers", "procs"):  # the processes it saw have been up that much longer
        if name in parts:
            parts[name] = _PS_LINE.sub(lambda p: p[1] + str(int(p[2]) + int(seconds)).encode() + p[3], parts[name])
    return Sections(parts)
