"""What nvidia-smi prints, for the stand-ins that play it (the demo's, the tests'): a real driver's spacing and order."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable, Sequence

# tests/fixtures/gpu-utilization: an H200 on driver 580.159.04 keeps 71 samples over 14.00 s.
DRIVER, CUDA = "580.159.04", "13.0"
DURATION, COUNT = "14.00 sec", "71"
_KEY_WIDTH = 55  # `Timestamp` and `        Max` alike: the colon stands in column 56
_ENGINES = (("Encoder", "ENC"), ("Decoder", "DEC"), ("JPEG", "JPG"), ("OFA", "OFA"))


def bus_id(index: int) -> str:
    """GPU `index`'s bus id, as `--query-gpu=pci.bus_id` and the `-q` headers print it (`00000000:18:00.0`)."""
    return f"00000000:{0x18 + index:02X}:00.0"


@dataclass(frozen=True)
class Samples:
    """One `… Utilization Samples` sub-block, as printed: text, so that N/A and broken drivers can be played."""

    max: str = "0 %"
    min: str = "0 %"
    avg: str = "0 %"
    duration: str = DURATION
    count: str = COUNT

    @classmethod
    def of(cls, utils: Iterable[float]) -> Samples:
        """Max, Min and Avg of these readings, in whole percents as the driver prints them (its Avg rounds down)."""
        values = [int(u) for u in utils]
        if not values:
            return NOT_AVAILABLE
        return cls(f"{max(values)} %", f"{min(values)} %", f"{sum(values) // len(values)} %")


NOT_AVAILABLE = Samples("N/A", "N/A", "N/A", "N/A", "N/A")


@dataclass(frozen=True)
class SmiGpu:
    """One GPU's block of `nvidia-smi -q -d UTILIZATION`."""

    bus_id: str
    gpu: str = "0 %"  # the instantaneous `Utilization / GPU` line
    memory: str = "0 %"
    gpu_samples: Samples = field(default_factory=Samples)
    memory_samples: Samples = field(default_factory=Samples)


def _line(indent: int, key: str, value: str) -> str:
    return f"{' ' * indent}{key:<{_KEY_WIDTH - indent}}: {value}"


def utilization_report(gpus: Sequence[SmiGpu], timestamp: str = "Tue Dec  1 13:25:20 2026") -> str:
    """`nvidia-smi -q -d UTILIZATION`: the log header, then each GPU's block and a blank line."""
    out = ["", "==============NVSMI LOG==============", "", _line(0, "Timestamp", timestamp),
           _line(0, "Driver Version", DRIVER), _line(0, "CUDA Version", CUDA), "",
           _line(0, "Attached GPUs", str(len(gpus)))]
    for g in gpus:
        engines_idle = Samples(duration=g.gpu_samples.duration, count=g.gpu_samples.count)
        out += [f"GPU {g.bus_id}", "    Utilization", _line(8, "GPU", g.gpu), _line(8, "Memory", g.memory)]
        out += [_line(8, name, "0 %") for name, _ in _ENGINES]
        for title, s in (("GPU", g.gpu_samples), ("Memory", g.memory_samples),
                         *((short, engines_idle) for _, short in _ENGINES)):
            out += [f"    {title} Utilization Samples", _line(8, "Duration", s.duration),
                    _line(8, "Number of Samples", s.count), _line(8, "Max", s.max), _line(8, "Min", s.min),
                    _line(8, "Avg", s.avg)]
        out.append("")
    return "\n".join(out) + "\n"
