"""The driver's utilisation window (issue 12): the real H200 captures classify right, the stand-in prints what the
driver prints, and every way `nvidia-smi -q -d UTILIZATION` falls short is said, in Python and in the probe's bash alike."""

from __future__ import annotations

import asyncio
import re
from dataclasses import dataclass, replace
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bot.core.facts import GpuMethod, UtilWindow, WindowGap
from bot.core.gpu_window import MAX_WINDOW_S, bus_key, match, parse_utilization
from bot.core.gpus import GpuBasis, classify, parse_gpu_section, parse_query_csv
from bot.core.history import observe
from bot.core.sections import split_sections
from bot.core.stages.findings import stuck_collective
from bot.demo.smi import NOT_AVAILABLE, Samples, SmiGpu, bus_id, utilization_report
from bot.probe.runners import LocalRunner
from bot.probe.script import build_script
from tests.standins import fake_nvidia_smi, path_with

FIXTURES = Path(__file__).parent / "fixtures" / "gpu-utilization"
NONCE = "abcdef0123456789"


def capture(name: str) -> tuple[str, str]:
    """(the capture's `-q -d UTILIZATION`, its --query-gpu row as the probe's own query prints it: no uuid)."""
    query = (FIXTURES / f"{name}.query-gpu.csv").read_text().split("# --query-compute-apps")[0]
    rows = ["".join(f"{f}," for f in fields[:2]) + ",".join(fields[3:])
            for fields in (line.split(",") for line in query.splitlines() if line.strip())]
    return (FIXTURES / f"{name}.utilization.txt").read_text(), "\n".join(rows) + "\n"


def rounds(*texts: str) -> str:
    """A probe's gpus section: these readings as its bash prints them, 0.2 s apart."""
    return "".join(f"# sample {n} t={1796028449 + 0.2 * n:.3f} rc=0\n{t.rstrip()}\n" for n, t in enumerate(texts, 1))


# ---------------------------------------------------------------- the real captures

@dataclass(frozen=True)
class Real:
    name: str
    cls: str
    window: tuple[float, float, float]  # Max, Min, Avg
    now: float  # the instantaneous utilization.gpu of the same moment
    stand_in: SmiGpu  # the values that make the stand-in print this capture byte for byte
    timestamp: str


REAL = [
    Real("steady", "busy", (99, 98, 98), 100,
         SmiGpu("00000000:00:06.0", "100 %", "24 %", Samples("99 %", "98 %", "98 %"), Samples("24 %", "22 %", "22 %")),
         "Tue Dec  1 13:24:58 2026"),
    Real("duty50", "oscillating", (99, 0, 49), 75,
         SmiGpu("00000000:00:06.0", "99 %", "24 %", Samples("99 %", "0 %", "49 %"), Samples("24 %", "0 %", "11 %")),
         "Tue Dec  1 13:25:20 2026"),
    Real("idle", "idle", (0, 0, 0), 0, SmiGpu("00000000:00:06.0"), "Tue Dec  1 13:25:39 2026"),
]


@pytest.mark.parametrize("real", REAL, ids=[r.name for r in REAL])
def test_each_capture_classifies_right(real):
    text, row = capture(real.name)
    report = classify(parse_gpu_section(rounds(row), text, 0))
    [g] = report.gpus
    assert g.cls == real.cls
    assert g.window == UtilWindow(14.0, 71, *map(float, real.window))
    assert g.now_pct == real.now and g.utils == (real.now,)
    assert (g.mem_used_mib, g.mem_total_mib, g.holds_memory) == (883.0 if real.name != "idle" else 0.0, 143771.0, False)
    assert report.basis == GpuBasis(GpuMethod.WINDOW, 14.0, 71)
    assert report.basis.phrase() == "driver window 14 s, 71 samples"


def test_the_instantaneous_reading_alone_would_have_called_the_duty_cycle_busy():
    """Why the window: duty50's one reading (75 %) says busy; 14 s of samples say it works half the time."""
    text, row = capture("duty50")
    assert classify(parse_gpu_section(rounds(row))).by_index(0).cls == "busy"
    assert classify(parse_gpu_section(rounds(row), text, 0)).by_index(0).cls == "oscillating"


@pytest.mark.parametrize("real", REAL, ids=[r.name for r in REAL])
def test_the_stand_in_prints_the_capture_byte_for_byte(real):
    assert utilization_report([real.stand_in], real.timestamp) == capture(real.name)[0]


def test_the_stand_in_synthesises_a_window_from_its_rounds():
    from tests.standins import synthesised_window

    text = synthesised_window(["0, 3133, 143771, 14\n1, 4, 143771, 0\n", "0, 3133, 143771, 100\n1, 4, 143771, 0\n"])
    blocks, gap = parse_utilization(text)
    assert gap is None and blocks == {bus_key(bus_id(0)): UtilWindow(14.0, 71, 100.0, 14.0, 57.0),
                                      bus_key(bus_id(1)): UtilWindow(14.0, 71, 0.0, 0.0, 0.0)}


# ---------------------------------------------------------------- classes from Max / Min / Avg

@pytest.mark.parametrize("window, cls", [
    ((99, 98, 98), "busy"),  # steady matmul (the capture)
    ((100, 55, 70), "busy"),  # never below 50 %: high all the window, whatever the Avg
    ((100, 0, 65), "busy"),  # up about two thirds of the time
    ((99, 0, 49), "oscillating"),  # a 50 % duty cycle (the capture)
    ((100, 0, 51), "oscillating"),  # the same loop, a sample later: jitter must not make it busy
    ((100, 0, 59), "oscillating"),
    ((60, 0, 2), "oscillating"),  # one burst: high once, not most of the time
    ((40, 5, 20), "low"),  # never high: copying weights in, not a loop
    ((45, 45, 45), "low"),
    ((2, 0, 1), "low"),
    ((1, 0, 0), "idle"),  # nvidia-smi's noise floor
    ((0, 0, 0), "idle"),
])
def test_window_classes(window, cls):
    text = utilization_report([SmiGpu(bus_id(0), gpu_samples=Samples(*(f"{v} %" for v in window)))])
    report = classify(parse_gpu_section(rounds(f"0, {bus_id(0)}, 4, 143771, 0"), text, 0))
    assert report.by_index(0).cls == cls


@pytest.mark.parametrize("window, share", [((99, 98, 98), 1.0), ((99, 0, 49), 49 / 99), ((40, 5, 20), 0.0),
                                           ((100, 20, 60), 0.5)])
def test_busy_share_over_the_window(window, share):
    text = utilization_report([SmiGpu(bus_id(0), gpu_samples=Samples(*(f"{v} %" for v in window)))])
    g = classify(parse_gpu_section(rounds(f"0, {bus_id(0)}, 4, 143771, 0"), text, 0)).by_index(0)
    assert g.busy_share == pytest.approx(share)


def test_a_rank_spinning_all_window_is_a_stuck_collective_and_a_duty_cycle_is_not():
    def report(window):
        text = utilization_report([SmiGpu(bus_id(0), gpu_samples=Samples(*(f"{v} %" for v in window))),
                                   SmiGpu(bus_id(1))])
        reading = f"0, {bus_id(0)}, 70000, 143771, 100\n1, {bus_id(1)}, 70000, 143771, 0"
        return classify(parse_gpu_section(rounds(reading), text, 0))

    spin = stuck_collective(report((100, 97, 99)))
    assert spin is not None and spin.detail == "GPU 0 at 100 % with no new steps (stuck in a collective?), waiting on idle GPU 1"
    assert report((100, 0, 80)).by_index(0).cls == "busy" and stuck_collective(report((100, 0, 80))) is None


def test_history_keeps_the_windows_share_of_time_busy():
    from bot.core.verdict import Level, Phase, Verdict

    text = utilization_report([SmiGpu(bus_id(0), gpu_samples=Samples("99 %", "0 %", "49 %")),
                               SmiGpu(bus_id(1), gpu_samples=Samples("99 %", "98 %", "98 %"))])
    reading = f"0, {bus_id(0)}, 2048, 143771, 75\n1, {bus_id(1)}, 2048, 143771, 100"
    gpu = classify(parse_gpu_section(rounds(reading), text, 0), {"target": [0, 1]})
    [point] = observe(Verdict("r", Phase.TRAINING, Level.OK, "training", gpu=gpu), 100.0, None)
    [load] = point.gpus
    assert (load.role, load.busy, load.mem_gib) == ("target", round((49 / 99 + 1.0) / 2, 3), 4.0)


# ---------------------------------------------------------------- when the window cannot serve

def one_gpu(**samples) -> str:
    return utilization_report([SmiGpu(bus_id(0), "97 %", gpu_samples=Samples(**{"max": "99 %", "min": "0 %",
                                                                                  "avg": "49 %", **samples}))])


GOOD = one_gpu()
# -q's output, its exit status, and why its window cannot serve (None: it can).
VARIANTS = {
    "good": (GOOD, 0, None),
    "two GPUs": (utilization_report([SmiGpu(bus_id(0)), SmiGpu(bus_id(1))]), 0, None),
    "N/A": (utilization_report([SmiGpu(bus_id(0), "N/A", "N/A", NOT_AVAILABLE, NOT_AVAILABLE)]), 0,
            WindowGap.NOT_AVAILABLE),
    "absurd duration": (one_gpu(duration="18446744073709 sec"), 0, WindowGap.ABSURD_DURATION),
    "zero duration": (one_gpu(duration="0.00 sec"), 0, WindowGap.ABSURD_DURATION),
    "just past the cap": (one_gpu(duration=f"{MAX_WINDOW_S + 0.01:.2f} sec"), 0, WindowGap.ABSURD_DURATION),
    "zero samples": (one_gpu(count="0"), 0, WindowGap.NO_SAMPLES),
    "no samples block": (GOOD.replace("    GPU Utilization Samples\n", "    GPU Utilization Sample\n"), 0,
                         WindowGap.MISSING),
    "no GPU at all": (utilization_report([]), 0, WindowGap.MISSING),
    "not -q at all": ("0, 31395, 143771, 97\n", 0, WindowGap.MISSING),
    "unsupported (exit 2)": ("Invalid combination of input arguments. Please run 'nvidia-smi -h' for help.\n", 2,
                             WindowGap.FAILED),
    "failed with a good text": (GOOD, 9, WindowGap.FAILED),
    "Avg above Max": (one_gpu(avg="100 %"), 0, WindowGap.UNREADABLE),
    "no unit": (one_gpu(max="99"), 0, WindowGap.UNREADABLE),
    "MIG": (GOOD.replace("    Utilization\n", "    MIG Devices\n        None\n    Utilization\n"), 0, WindowGap.MIG),
    "vGPU": (GOOD.replace("    Utilization\n", "    vGPU Software Licensed Product\n    Utilization\n"), 0,
             WindowGap.VGPU),
    "other bus id": (GOOD.replace(f"GPU {bus_id(0)}", "GPU 00000000:9A:00.0"), 0, WindowGap.UNMATCHED),
    "bus id written another way": (GOOD.replace(f"GPU {bus_id(0)}", "GPU 0000:18:00.0"), 0, None),
    "one of two N/A": (utilization_report([SmiGpu(bus_id(0)), SmiGpu(bus_id(1), "N/A", "N/A", NOT_AVAILABLE)]), 0,
                       WindowGap.NOT_AVAILABLE),
    "one of two missing": (utilization_report([SmiGpu(bus_id(1))]), 0, WindowGap.UNMATCHED),
}
TWO_GPUS = {"two GPUs", "one of two N/A", "one of two missing"}


def reading_for(name: str) -> str:
    rows = [f"0, {bus_id(0)}, 31395, 143771, 97"] + ([f"1, {bus_id(1)}, 4, 143771, 0"] if name in TWO_GPUS else [])
    return "\n".join(rows)


@pytest.mark.parametrize("name", VARIANTS)
def test_what_the_window_says_or_why_not(name):
    text, rc, gap = VARIANTS[name]
    got = parse_gpu_section(rounds(reading_for(name)), text, rc)
    assert got.gap == gap
    assert got.method is (GpuMethod.WINDOW if gap is None else GpuMethod.READINGS)


def test_without_the_window_the_answer_says_why():
    text, rc, _ = VARIANTS["absurd duration"]
    readings = [f"0, {bus_id(0)}, 31395, 143771, {u}" for u in (100, 0, 100, 0, 100)]
    report = classify(parse_gpu_section(rounds(*readings), text, rc))
    assert report.by_index(0).cls == "busy" and report.by_index(0).window is None
    assert report.basis == GpuBasis(GpuMethod.READINGS, pytest.approx(0.8), 5, WindowGap.ABSURD_DURATION)
    assert report.basis.phrase() == "5 readings over 0.8 s (driver window: absurd duration)"


@pytest.mark.parametrize("basis, phrase", [
    (GpuBasis(GpuMethod.READINGS, 0.8, 5), "5 readings over 0.8 s"),  # a probe from before issue 12
    (GpuBasis(GpuMethod.READINGS, None, 1, WindowGap.NOT_AVAILABLE), "1 reading (driver window: N/A)"),
    (GpuBasis(GpuMethod.READINGS, None, 1, WindowGap.FAILED), "1 reading (driver window: nvidia-smi -q failed)"),
    (GpuBasis(GpuMethod.WINDOW, 16.67, 100), "driver window 17 s, 100 samples"),
    (GpuBasis(GpuMethod.WINDOW, 1.2, 1), "driver window 1.2 s, 1 sample"),
    (GpuBasis(GpuMethod.READINGS, 0.94, 2), "2 readings over 0.9 s"),
])
def test_the_basis_in_words(basis, phrase):
    assert basis.phrase() == phrase


def test_two_gpus_with_roles_from_the_window():
    text = utilization_report([SmiGpu(bus_id(0), gpu_samples=Samples("99 %", "98 %", "98 %")),
                               SmiGpu(bus_id(1), gpu_samples=Samples("0 %", "0 %", "0 %"))])
    reading = f"0, {bus_id(0)}, 31395, 143771, 0\n1, {bus_id(1)}, 18211, 143771, 0"  # GPU 0 caught between steps
    report = classify(parse_gpu_section(rounds(reading), text, 0), {"target": [0], "drafter": [1]})
    assert report.summary() == "target 0 busy · drafter 1 idle (memory held)"
    assert report.findings == ("drafter GPU 1 idle with 18 GiB held",)
    assert report.basis.method is GpuMethod.WINDOW


def test_bus_ids_match_by_value_not_by_text():
    assert bus_key("00000000:00:06.0") == bus_key("0000:00:06.0") == bus_key(" 00000000:00:06.0 ") == "0:0:6.0"
    assert bus_key("00000000:C1:00.0") == bus_key("00000000:c1:00.0") == "0:c1:0.0"
    assert bus_key("GPU-9cc0b41d") is None and bus_key("00:06") is None and bus_key("") is None


def test_the_probes_query_rows_carry_their_bus_id():
    rows, error = parse_query_csv(f"0, {bus_id(0)}, 31395, 143771, 97\n1, [N/A], 4, 143771, 0\n")
    assert error is None
    assert [(r.index, r.bus_id, r.mem_used_mib, r.util_pct) for r in rows] == [(0, "0:18:0.0", 31395.0, 97.0),
                                                                               (1, None, 4.0, 0.0)]


def test_no_reading_no_window():
    """A reading that failed leaves nothing to match: the readings' own error says what went wrong."""
    got = parse_gpu_section("# sample 1 t=1 rc=9\nNVIDIA-SMI has failed because it couldn't communicate with "
                            "the NVIDIA driver.\n", GOOD, 0)
    assert (got.windows, got.gap) == ((), None) and "driver not loaded" in got.error


def test_all_or_nothing_like_the_probe():
    blocks, gap = parse_utilization(VARIANTS["one of two N/A"][0])
    rows = parse_query_csv(reading_for("one of two N/A"))[0]
    assert blocks[bus_key(bus_id(0))] == UtilWindow(14.0, 71, 0.0, 0.0, 0.0)  # GPU 0 alone would do
    assert match(blocks, gap, rows) == ((), WindowGap.NOT_AVAILABLE)


# ---------------------------------------------------------------- the probe's bash decides the same

@dataclass
class Target:
    log: str
    step_pattern: str | None = None
    gpu_samples: int = 3


@pytest.mark.parametrize("name", VARIANTS)
def test_the_probe_samples_exactly_where_python_cannot_use_the_window(tmp_path, name):
    """window_ok (bash) and bot.core.gpu_window (Python) are two readings of one rule: each variant must
    make both say the same, or the probe would skip the readings the diagnosis then lacks."""
    text, rc, gap = VARIANTS[name]
    rows = reading_for(name).replace(f", {bus_id(0)},", ",").replace(f", {bus_id(1)},", ",")  # the stand-in adds them
    fake_nvidia_smi(tmp_path / "bin", [rows + "\n"], window=text, window_rc=rc)
    (tmp_path / "bin" / "sleep").write_text("#!/bin/sh\n")  # the readings' spacing is not under test here
    (tmp_path / "bin" / "sleep").chmod(0o755)
    result = asyncio.run(LocalRunner(path_with(tmp_path / "bin")).run(
        build_script(Target(str(tmp_path / "x.log")), NONCE), timeout=30))
    s = split_sections(result.stdout, NONCE)
    got = parse_gpu_section(s.text("gpus"), s.text("gpu.window"), s.rc("gpu.window"))
    taken = s.text("gpus").count("# sample")
    assert (taken, got.gap) == (1 if gap is None else 3, gap)
    assert s.rc("gpu.window") == rc


def test_a_missing_nvidia_smi_asks_for_no_window(tmp_path):
    result = asyncio.run(LocalRunner({"PATH": "/usr/bin:/bin"}).run(build_script(Target(str(tmp_path / "x")), NONCE),
                                                                     timeout=30))
    s = split_sections(result.stdout, NONCE)
    assert s.text("gpus").strip() == "@missing" and "gpu.window" not in s.parts


# ---------------------------------------------------------------- never raises

WINDOW_TOKENS = st.sampled_from([
    "\n", "GPU 00000000:18:00.0", "GPU 0:0:0.0", "GPU x", "    GPU Utilization Samples", "    Utilization",
    "        Duration : ", "        Number of Samples : ", "        Max : ", "        Min : ", "        Avg : ",
    "14.00 sec", "18446744073709 sec", "99 %", "0 %", "N/A", "71", "0", "MIG", "vGPU", "9" * 5000, ":", " ", "\x00"])


@settings(max_examples=300, deadline=None)
@given(st.one_of(st.text(), st.lists(WINDOW_TOKENS, max_size=80).map("".join)), st.one_of(st.none(), st.integers(-1, 300)))
def test_parse_never_raises(text, rc):
    blocks, gap = parse_utilization(text)
    assert all(isinstance(w, (UtilWindow, WindowGap)) for w in blocks.values())
    got = parse_gpu_section(rounds(f"0, {bus_id(0)}, 4, 143771, 0"), text, rc)
    report = classify(got)
    report.basis.phrase()
    for w in (w for _, w in got.windows):
        assert 0 < w.duration_s <= MAX_WINDOW_S and w.samples > 0 and 0 <= w.min_pct <= w.avg_pct <= w.max_pct <= 100
    assert replace(report.basis).method is got.method


def test_a_hung_window_call_is_not_followed_by_a_query_that_would_hang_as_long(tmp_path):
    fake_nvidia_smi(tmp_path / "bin", ["0, 31395, 143771, 97\n"])
    # `timeout 10` ran out on -q (exit 124): played at once, so the test does not wait the ten seconds.
    (tmp_path / "bin" / "timeout").write_text('#!/bin/bash\nshift\ncase " $* " in *" -q "*) exit 124 ;; esac\nexec "$@"\n')
    (tmp_path / "bin" / "timeout").chmod(0o755)
    result = asyncio.run(LocalRunner(path_with(tmp_path / "bin")).run(build_script(Target(str(tmp_path / "x")), NONCE),
                                                                     timeout=30))
    s = split_sections(result.stdout, NONCE)
    assert s.rc("gpu.window") == 124
    assert (tmp_path / "bin" / "smi-rounds" / "counter").read_text().strip() == "0"  # no --query-gpu call
    got = parse_gpu_section(s.text("gpus"), s.text("gpu.window"), s.rc("gpu.window"))
    assert (got.error, got.gap) == ("nvidia-smi timed out", WindowGap.FAILED)


@pytest.mark.parametrize("window, answer", [
    (None, ["  target 0 busy · drafter 1 idle (memory held)",
            r"  util from driver window 14 s, 71 samples",
            "  target (0)",
            "    GPU 0: busy        31/140 GiB       util % avg 66 · 0–100 · now 100",
            "  drafter (1)",
            "    GPU 1: idle        18/140 GiB       util % avg 0 · 0–0 · now 0",
            "  ! drafter GPU 1 idle with 18 GiB held"]),
    (utilization_report([SmiGpu(bus_id(0), "N/A", "N/A", NOT_AVAILABLE, NOT_AVAILABLE),
                         SmiGpu(bus_id(1), "N/A", "N/A", NOT_AVAILABLE, NOT_AVAILABLE)]),
     ["  target 0 busy · drafter 1 idle (memory held)",
      r"  util from 3 readings over (0\.9|1) s \(driver window: N/A\)",  # ~0.9 s of sleeps, a little more if busy
      "  target (0)",
      "    GPU 0: busy        31/140 GiB       util % 100 0 100",
      "  drafter (1)",
      "    GPU 1: idle        18/140 GiB       util % 0 0 0",
      "  ! drafter GPU 1 idle with 18 GiB held"]),
], ids=["window", "N/A: readings"])
def test_two_gpus_with_roles_end_to_end(tmp_path, window, answer):
    """The real probe on a local log, a stand-in nvidia-smi, the diagnosis and `runbot gpus`'s text."""
    from bot.probe.checkup import check
    from bot.probe.replay import DefaultRun
    from bot.render import text as render_text

    log = tmp_path / "train.log"
    log.write_text("step=1 loss=2.0\n")
    rounds_ = [f"0, 31395, 143771, {u}\n1, 18211, 143771, 0\n" for u in (100, 0, 100)]
    fake_nvidia_smi(tmp_path / "bin", rounds_, window=window)
    run = DefaultRun("r", str(log), gpu_samples=3, gpus={"target": [0], "drafter": [1]})
    v = asyncio.run(check(run, LocalRunner(path_with(tmp_path / "bin"))))
    got = render_text.gpus(v).splitlines()[1:]
    assert got[:1] + got[2:] == answer[:1] + answer[2:]
    assert re.fullmatch(answer[1], got[1]), got[1]  # the basis line: a pattern
