"""Value objects shared by every layer: steps, bars, crashes, processes, GPU readings."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Step:
    """One progress line of a training loop, with whatever numbers it carried."""

    line: str  # the line as shown to users (ANSI stripped)
    step: int | None = None  # step / iteration number
    total: int | None = None  # planned steps, when the format says (Megatron, Lightning)
    loss: float | None = None
    rate: float | None = None  # throughput
    rate_unit: str | None = None  # "tok/s", "it/s", "samples/s"…
    epoch: float | None = None
    elapsed: float | None = None  # seconds since the run started, when printed (step=… elapsed=3.4s)
    fmt: str = "custom"  # which recogniser matched: "kv", "hf", "torchtitan", "megatron", "nanogpt", "lightning", "custom"


@dataclass(frozen=True)
class Bar:
    """The last frame of a tqdm progress bar."""

    desc: str  # "Loading weights"
    pct: int | None
    n: int | None
    total: int | None
    rate: str | None = None  # "199.62it/s"
    elapsed: str | None = None  # "00:03"
    remaining: str | None = None  # "00:12"
    frame: str = ""  # the frame as printed

    @property
    def finished(self) -> bool:
        return self.total is not None and self.n is not None and self.n >= self.total


@dataclass(frozen=True)
class Crash:
    """A traceback or fatal signature found near the end of the log."""

    kind: str  # "traceback", "oom", "nccl_timeout", "nccl_error", "child_failed", "killed", "segfault"
    exc_type: str | None = None  # "torch.OutOfMemoryError"
    message: str = ""  # first line of the exception message, trimmed
    thread: str | None = None  # "drafter-1" for `Exception in thread drafter-1:`
    rank: int | None = None  # failing rank ([rank3]: prefix or torchrun Root Cause)
    exit_code: int | None = None  # torchrun Root Cause exitcode (-9 SIGKILL, -6 SIGABRT)
    signal_hint: str | None = None  # "SIGKILL (often the kernel's OOM killer)"
    line_index: int = -1  # index of the signature's first line in the scanned lines

    @property
    def in_thread(self) -> bool:
        return self.thread is not None


@dataclass(frozen=True)
class Process:
    """A process seen by the probe (a writer of the log, or a likely training process)."""

    pid: int
    elapsed_s: int | None  # seconds since it started
    command: str


@dataclass(frozen=True)
class GpuSample:
    """One nvidia-smi reading of one GPU."""

    index: int
    util_pct: float | None  # None when nvidia-smi printed [N/A]
    mem_used_mib: float | None
    mem_total_mib: float | None = None


@dataclass(frozen=True)
class GpuReadings:
    """All samples of all GPUs from one probe, or why there are none."""

    samples: tuple[tuple[GpuSample, ...], ...] = ()  # one tuple per sampling round
    error: str | None = None  # "nvidia-smi not found", "NVIDIA driver not loaded"…

    @property
    def indices(self) -> list[int]:
        return sorted({g.index for round_ in self.samples for g in round_})


@dataclass(frozen=True)
class Activity:
    """A non-training phase announced by the last lines: saving, evaluating, compiling."""

    kind: str  # "saving", "evaluating", "compiling"
    line: str
    step: int | None = None
    line_index: int = -1
