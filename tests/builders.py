"""Plain-data builders: probe sections as the script would print them, without running anything."""

from __future__ import annotations

from typing import Sequence

from bot.core.evidence import Evidence, read_evidence
from bot.core.sections import Sections

NOW = 1_796_028_500.0

# Logs that print a private key (made up: base64 that decodes to nothing), as a tail may show it.
KEY_BODY = ["MIIEowIBAAKCAQEA" + "q7Lx" * 12, "Zm9vYmFyYmF6" * 5 + "ab+/", "AbC9+/kQ=="]
KEY_LOGS = {
    "whole": ["-----BEGIN RSA PRIVATE KEY-----", *KEY_BODY, "-----END RSA PRIVATE KEY-----", "step=3 loss=2.0"],
    "cut off": ["step=3 loss=2.0", "-----BEGIN OPENSSH PRIVATE KEY-----", *KEY_BODY],
    "ranks": [f"[rank0]:{x}" for x in ["-----BEGIN EC PRIVATE KEY-----", *KEY_BODY, "-----END EC PRIVATE KEY-----"]],
    "window starts inside": [*KEY_BODY, "-----END PRIVATE KEY-----", "step=3 loss=2.0"],
}


def gpu_section(rounds: Sequence[Sequence[tuple[int, float, float]]], total: float = 143771, *,
                bus_ids: bool = False) -> str:
    """rounds of (index, MiB used, util %) -> the probe's gpus section body (with each GPU's pci.bus_id, as
    probes since issue 12 print it, when `bus_ids`)."""
    from bot.demo.smi import bus_id

    out = []
    for i, rows in enumerate(rounds, 1):
        out.append(f"# sample {i} t={NOW + i * 0.25} rc=0")
        out += [f"{idx}, {bus_id(idx) + ', ' if bus_ids else ''}{mem:g}, {total:g}, {util:g}" for idx, mem, util in rows]
    return "\n".join(out) + "\n"


def gpu_window(windows: Sequence[tuple[int, float, float, float]]) -> str:
    """(index, Max, Min, Avg) per GPU -> the probe's gpu.window section body: `nvidia-smi -q -d UTILIZATION`."""
    from bot.demo.smi import Samples, SmiGpu, bus_id, utilization_report

    return utilization_report([SmiGpu(bus_id(i), gpu_samples=Samples(f"{hi:g} %", f"{lo:g} %", f"{avg:g} %"))
                               for i, hi, lo, avg in windows])


def sections(
    log: bytes | str | None,
    *,
    age: float = 2.0,
    writers: Sequence[tuple[int, int, str]] = ((692, 40, "python3 train.py"),),
    processes: Sequence[tuple[int, int, str]] = (),
    gpus: str = "",
    window: str | None = None,
    steps_section: str = "",
    now: float = NOW,
    hidden: int = 0,
    readable: bool = True,
    near: Sequence[tuple[int, int, str]] = (),
) -> Sections:
    parts: dict[str, bytes] = {"end": b""}
    if log is None:
        parts["meta"] = f"now={now}\nhost=ct200\nexists=0\n".encode()
    else:
        data = log.encode() if isinstance(log, str) else log
        parts["meta"] = f"now={now}\nhost=ct200\nsize={len(data)} mtime={int(now - age)} inode=12\n".encode()
        if not readable:
            parts["meta"] += b"readable=0\n"
            data = b""
        parts["window"] = data[-65536:]
        parts["window.rc"] = b"0"
        parts["steps"] = steps_section.encode()
        parts["writers"] = (f"# hidden {hidden}\n" + "".join(f"{p} {e} {c}\n" for p, e, c in writers)).encode()
        if near:  # what the probe prints when nobody holds the log but processes work in its folder
            parts["writers"] += ("# near\n" + "".join(f"{p} {e} {c}\n" for p, e, c in near)).encode()
    parts["procs"] = "".join(f"{p} {e} {c}\n" for p, e, c in processes).encode()
    parts["gpus"] = gpus.encode()
    if window is not None:  # the driver's window, as `nvidia-smi -q -d UTILIZATION` printed it (exit status 0)
        parts["gpu.window"], parts["gpu.window.rc"] = window.encode(), b"0"
    return Sections(parts)


def evidence(log: bytes | str | None, path: str = "/workspace/train.log", **kw) -> Evidence:
    return read_evidence(sections(log, **kw), path)


def probe_stdout(parts: Sections, nonce: str) -> bytes:
    """What the probe script prints for these sections (split_sections reads it back to them)."""
    from bot.core.sections import marker

    return b"".join(marker(nonce) + name.encode() + b"\n" + body for name, body in parts.parts.items())


class CannedRunner:
    """A Runner that answers each probe script at once with `answer()`'s sections (no bash, no log):
    for watchdog tests of many runs over simulated hours, where the diagnosis is real and the probe is not."""

    def __init__(self, answer) -> None:
        self.answer, self.calls = answer, 0

    async def run(self, script: str, *, timeout: float, limit=None):
        import re

        from bot.probe.runners import RunResult

        self.calls += 1
        nonce = re.search(r"^NONCE=(\S+)$", script, re.M)[1].strip("'")
        return RunResult(probe_stdout(self.answer(), nonce), exit_status=0)
