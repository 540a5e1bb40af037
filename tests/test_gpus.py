"""bot.core.gpus: nvidia-smi parsing on real captures and failure texts, GPU classification by role."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bot.core.facts import GpuReadings, GpuSample
from bot.core.gpus import (
    HOLDS_MEMORY_MIB,
    MAX_ERROR_CHARS,
    classify,
    format_indices,
    parse_gpu_section,
    parse_query_csv,
)
from tests.standins import REAL_FIXTURES

REAL = REAL_FIXTURES

DRIVER = ("NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. "
          "Make sure that the latest NVIDIA driver is installed and running.")
DRIVER_ERROR = ("nvidia-smi failed: NVIDIA driver not loaded (NVIDIA-SMI has failed because it "
                "couldn't communicate with the NVIDIA driver…)")
MISMATCH = "Failed to initialize NVML: Driver/library version mismatch"
MISMATCH_ERROR = "nvidia-smi: Failed to initialize NVML: Driver/library version mismatch"
MISSING = "nvidia-smi not found on the probe's PATH"

# The diagnosis doc's real 8-GPU case (index, MiB used, util %): target 0–4, drafters 5–7.
DOC_EIGHT = [(0, 67133, 5), (1, 97051, 100), (2, 67247, 9), (3, 71411, 15),
             (4, 70925, 83), (5, 43747, 0), (6, 96871, 100), (7, 77249, 0)]
DOC_ROLES = {"target": [0, 1, 2, 3, 4], "drafter": [5, 6, 7]}


def real(name: str) -> tuple[str, int]:
    """A capture's output and its exit status (the capture script's trailing `rc=N` line)."""
    body, _, last = REAL.joinpath(name).read_text().rstrip("\n").rpartition("\n")
    assert last.startswith("rc="), name
    return body, int(last.removeprefix("rc="))


def section(*rounds: tuple[int, str]) -> str:
    """A probe GPU section, exactly as the probe's bash prints it."""
    return "".join(f"# sample {n} t=1796028449.{n:09d} rc={rc}\n{out.rstrip(chr(10))}\n"
                   for n, (rc, out) in enumerate(rounds, 1))


def rows_of(samples) -> list[tuple]:
    return [(s.index, s.mem_used_mib, s.mem_total_mib, s.util_pct) for s in samples]


def readings(*rounds: list[tuple]) -> GpuReadings:
    """Rounds of (index, util, MiB used[, MiB total]) tuples."""
    return GpuReadings(samples=tuple(tuple(GpuSample(r[0], r[1], r[2], *r[3:]) for r in round_)
                                     for round_ in rounds))


# ---------------------------------------------------------------- formatting

@pytest.mark.parametrize("indices, text", [
    ([0, 1, 2, 3, 4, 6], "0–4, 6"),
    ([5], "5"),
    ([], ""),
    ([3, 1, 2, 2], "1–3"),
    ([0, 2, 4], "0, 2, 4"),
    ([5, 6, 7], "5–7"),
    ([1, 4, 0, 2, 3, 7], "0–4, 7"),
])
def test_format_indices(indices, text):
    assert format_indices(indices) == text


# ---------------------------------------------------------------- parse_query_csv

@pytest.mark.parametrize("text, rows", [
    ("0, 3133, 143771, 14\n1, 4, 143771, 0\n", [(0, 3133, 143771, 14), (1, 4, 143771, 0)]),
    ("0, 3133 MiB, 143771 MiB, 14 %\n", [(0, 3133, 143771, 14)]),
    ("index, memory.used [MiB], memory.total [MiB], utilization.gpu [%]\n0, 3133 MiB, 143771 MiB, 14 %\n",
     [(0, 3133, 143771, 14)]),
    ("0, [N/A], [N/A], [N/A]\n1, 4, 143771, [Not Supported]\n2, N/A, 143771, 7\n",
     [(0, None, None, None), (1, 4, 143771, None), (2, None, 143771, 7)]),
    ("\n\n0, 1, 2, 3\r\n\r\n1, 5, 6, 7\r\n", [(0, 1, 2, 3), (1, 5, 6, 7)]),
    ("0, 1, 2, 3\r1, 5, 6, 7", [(0, 1, 2, 3), (1, 5, 6, 7)]),
    ("0, 0 MiB, 15 %\n1, 0 MiB, 0 %\n", [(0, 0, None, 15), (1, 0, None, 0)]),  # the hand-typed 3 columns
    ("0,12.5,80,99.5", [(0, 12.5, 80, 99.5)]),
    ("", []),
])
def test_parse_query_csv_rows(text, rows):
    got, error = parse_query_csv(text)
    assert error is None
    assert rows_of(got) == rows


@pytest.mark.parametrize("text, error", [
    (DRIVER, DRIVER_ERROR),
    (MISMATCH, MISMATCH_ERROR),
    ("No devices were found", "nvidia-smi: no devices were found"),
    ('Field "bogus.field" is not a valid field to query.\n\n', 'nvidia-smi: unknown query field "bogus.field"'),
    ("bash: nvidia-smi: command not found", MISSING),
    ("Unable to determine the device handle for GPU0000:00:06.0: GPU is lost.  Reboot the system to recover this GPU",
     "nvidia-smi: a GPU fell off the bus (GPU is lost; the host needs a reboot)"),
    ("Failed to initialize NVML: Insufficient Permissions", "nvidia-smi: Failed to initialize NVML: Insufficient Permissions"),
    ("Segmentation fault (core dumped)", "nvidia-smi: Segmentation fault (core dumped)"),
    ("1, 4, 1437", "nvidia-smi printed a garbled row: '1, 4, 1437'"),  # util over 100: cut short
    ("0, 3133 %, 143771, 14", "nvidia-smi printed a garbled row: '0, 3133 %, 143771, 14'"),  # wrong unit
    ("memory.used [MiB], utilization.gpu [%]\n3133 MiB, 14 %", "nvidia-smi output has no index column"),
])
def test_parse_query_csv_errors(text, error):
    rows, got = parse_query_csv(text)
    assert rows == []
    assert got == error


def test_partial_output_keeps_rows_and_error():
    rows, error = parse_query_csv("0, 3133, 143771, 14\nUnable to determine the device handle for GPU0000:00:07.0: "
                                  "Unknown Error\n")
    assert rows_of(rows) == [(0, 3133, 143771, 14)]
    assert error == "nvidia-smi: Unable to determine the device handle for GPU0000:00:07.0: Unknown Error"


def test_truncated_last_row_is_not_taken_for_a_row():
    rows, error = parse_query_csv("0, 3133, 143771, 14\n1, 4, 1437")
    assert rows_of(rows) == [(0, 3133, 143771, 14)]
    assert error == "nvidia-smi printed a garbled row: '1, 4, 1437'"


@pytest.mark.parametrize("name, rc, rows, error", [
    ("nvidia-smi_q_seed_idle.txt", 0, [(0, 0, None, 0), (1, 0, None, 0)], None),
    ("nvidia-smi_q_nounits_idle.txt", 0, [(0, 0, 143771, 0), (1, 0, 143771, 0)], None),
    ("nvidia-smi_q_full_idle.txt", 0, [(0, 0, 143771, 0), (1, 0, 143771, 0)], None),  # header names the columns
    ("nvidia-smi_apps_idle.txt", 0, [], None),
    ("nvidia-smi_q_badfield.txt", 2, [], 'nvidia-smi: unknown query field "bogus.field"'),
    ("nvidia-smi_q_badindex.txt", 6, [], "nvidia-smi: no devices were found"),
    ("nvidia-smi_smi_full_idle.txt", 0, [], "nvidia-smi printed its status table, not the CSV query"),
])
def test_real_captures(name, rc, rows, error):
    body, got_rc = real(name)
    assert got_rc == rc
    got, got_error = parse_query_csv(body)
    assert rows_of(got) == rows
    assert got_error == error


@pytest.mark.parametrize("name, error", [
    ("nvidia-smi_q_badfield.txt", 'nvidia-smi: unknown query field "bogus.field"'),
    ("nvidia-smi_q_badindex.txt", "nvidia-smi: no devices were found"),
    ("nvidia-smi_apps_idle.txt", "nvidia-smi printed no GPU rows"),
])
def test_real_captures_as_probe_rounds(name, error):
    body, rc = real(name)
    got = parse_gpu_section(section((rc, body), (rc, body)))
    assert got.samples == ()
    assert got.error == error


# ---------------------------------------------------------------- parse_gpu_section

def test_section_of_rounds():
    got = parse_gpu_section(section((0, "0, 3133, 143771, 14\n1, 4, 143771, 0"),
                                    (0, "0, 3140, 143771, 100\n1, 4, 143771, 0")))
    assert got.error is None
    assert [rows_of(r) for r in got.samples] == [
        [(0, 3133, 143771, 14), (1, 4, 143771, 0)], [(0, 3140, 143771, 100), (1, 4, 143771, 0)]]
    assert got.indices == [0, 1]


@pytest.mark.parametrize("body, rounds, error", [
    ("@missing\n", 0, MISSING),
    ("", 0, "GPU section empty: probe output truncated?"),
    ("\n \n", 0, "GPU section empty: probe output truncated?"),
    (section((9, DRIVER), (9, DRIVER)), 0, DRIVER_ERROR),
    (section((18, MISMATCH)), 0, MISMATCH_ERROR),
    (section((9, "")), 0, "nvidia-smi failed: NVIDIA driver not loaded"),
    (section((127, "")), 0, MISSING),
    (section((42, "")), 0, "nvidia-smi failed with exit status 42"),
    # the first failing round's error is kept; healthy rounds keep their rows
    (section((0, "0, 1, 2, 3"), (6, "No devices were found"), (9, DRIVER)), 1, "nvidia-smi: no devices were found"),
    (section((0, "0, 1, 2, 3"), (0, "")), 1, None),  # an empty round is not an error
    (section((0, ""), (0, "")), 0, "nvidia-smi printed no GPU rows"),
    ("# sample 1 t=1796028449.886 rc=0\n0, 1, 2, 3\n# sample 2 t=17960", 1, None),  # header cut short
    ("# sample 1 t=1 rc=0\n0, 1, 2, 3\n1, 4, 14", 1, "nvidia-smi printed a garbled row: '1, 4, 14'"),
    ("junk\n" + section((0, "0, 1, 2, 3")), 1, "GPU section has stray text before its first '# sample': junk"),
    ("hello world", 0, "GPU section unreadable (no '# sample' round): hello world"),
    ("0, 1, 2, 3\n", 1, None),  # bare CSV without round header: tolerated
    ("0, 1, 2, 3\nNo devices were found", 1, "nvidia-smi: no devices were found"),
    ("\x00\x00" + section((0, "0, 1,\x00 2, 3")), 1, None),
    ("# sample 1 t=1 rc=0\n" + "x" * 1_000_000 + "\n", 0, "nvidia-smi: " + "x" * (MAX_ERROR_CHARS - 13) + "…"),
])
def test_section_failures(body, rounds, error):
    got = parse_gpu_section(body)
    assert len(got.samples) == rounds
    assert got.error == error


def test_garbage_says_what_is_wrong():
    got = parse_gpu_section("# sample 1 t=1 rc=0\n" + "0," * 500_000 + "\n")
    assert got.error and got.error.startswith("nvidia-smi printed a garbled row: '0,0,0")
    assert len(got.error) <= MAX_ERROR_CHARS


# ---------------------------------------------------------------- the real healthy run, probed every 0.7 s

def timeline() -> list[dict]:
    """timeline_ok.txt as [{"size": bytes, "steps": bool, "smi": text}], one per probe."""
    out = []
    for chunk in REAL.joinpath("timeline_ok.txt").read_text().split("=== t=")[1:]:
        size = int(re.search(r"size=(\d+)", chunk)[1])
        # A tail ending in an unfinished bar has no newline, so "--- smi" can start mid-line.
        parts = dict(re.findall(r"--- (grep|exc|tail|smi|apps|ps)\n(.*?)(?=--- (?:exc|tail|smi|apps|ps)\n|\Z)",
                                chunk, re.S))
        out.append({"size": size, "steps": "step=" in parts["grep"], "smi": parts["smi"]})
    return out


def windows(samples: list[dict], n: int = 3) -> list[list[dict]]:
    return [samples[i:i + n] for i in range(len(samples) - n + 1)]


def test_timeline_training_reads_gpu0_working_and_gpu1_empty():
    training = [w for w in windows(timeline())
                if all(s["steps"] for s in w) and all(a["size"] < b["size"] for a, b in zip(w, w[1:]))]
    assert len(training) >= 10
    for w in training:
        report = classify(parse_gpu_section(section(*[(0, s["smi"]) for s in w])))
        assert report.error is None
        assert report.by_index(0).cls in ("busy", "oscillating"), [s["smi"] for s in w]
        assert report.by_index(0).holds_memory
        gpu1 = report.by_index(1)
        assert (gpu1.cls, gpu1.holds_memory) == ("idle", False)


def test_timeline_after_training_done_gpu0_idle_with_memory_held():
    last = timeline()[-2:]
    report = classify(parse_gpu_section(section(*[(0, s["smi"]) for s in last])))
    assert report.summary() == "GPU 0 idle (memory held) · 1 idle"
    assert [g.index for g in report.idle_with_memory()] == [0]
    assert report.findings == ("GPU 0 idle with 31 GiB held",)


def test_timeline_start_single_reading_is_not_a_verdict():
    first = timeline()[:3]  # 15 % then 0 % then 0 %: context creation, not work
    report = classify(parse_gpu_section(section(*[(0, s["smi"]) for s in first])))
    # Neither idle (one reading is 15 %) nor a live loop (never high): "low".
    assert report.by_index(0).cls == "low"
    assert report.by_index(0).utils == (15.0, 0.0, 0.0)


# ---------------------------------------------------------------- classify

@pytest.mark.parametrize("utils, cls", [
    ([100, 100, 100], "busy"),
    ([100, 0, 100], "busy"),
    ([0, 100, 0, 100], "oscillating"),  # a loop sleeping between steps
    ([100, 0], "oscillating"),
    ([60, 40, 30], "oscillating"),
    ([5], "low"),  # never high: not a live loop
    ([30, 12, 45], "low"),
    ([0, 0, 0], "idle"),
    ([1, 0], "idle"),
    ([2, 0], "low"),
    ([None, 0], "idle"),
    ([None, None], "unknown"),
    ([float("nan"), 100], "busy"),
])
def test_classes(utils, cls):
    report = classify(readings(*[[(0, u, 4.0)] for u in utils]))
    assert report.by_index(0).cls == cls


@pytest.mark.parametrize("mibs, used, holds", [
    ([4], 4, False),
    ([HOLDS_MEMORY_MIB], HOLDS_MEMORY_MIB, False),
    ([HOLDS_MEMORY_MIB + 1], HOLDS_MEMORY_MIB + 1, True),
    ([31395, None], 31395, True),  # the latest reading that was printed
    ([31395, 4], 4, False),
    ([None], None, False),
])
def test_memory(mibs, used, holds):
    state = classify(readings(*[[(0, 0, m)] for m in mibs])).by_index(0)
    assert (state.mem_used_mib, state.holds_memory) == (used, holds)


def test_doc_eight_gpu_example_with_roles():
    report = classify(readings([(i, u, m, 143771) for i, m, u in DOC_EIGHT]), DOC_ROLES)
    assert report.roles == (("target", (0, 1, 2, 3, 4)), ("drafter", (5, 6, 7)))
    assert report.summary() == ("target 1, 4 busy · 0, 2–3 low · "
                                "drafter 6 busy · 5, 7 idle (memory held)")
    assert report.findings == (
        "drafter GPU 5 holds 43 GiB, its siblings 75–95 GiB: model not loaded or its thread died?",
        "drafter GPUs 5, 7 idle with 43–75 GiB held",
    )
    assert report.lines() == ["target 1, 4 busy · 0, 2–3 low",
                              "drafter 6 busy · 5, 7 idle (memory held)", *report.findings]
    assert all(len(line) <= 45 for line in report.lines()[:2])
    assert [g.index for g in report.in_role("drafter")] == [5, 6, 7]
    assert [g.index for g in report.busy()] == [1, 4, 6]
    assert [g.index for g in report.idle()] == [5, 7]
    assert report.by_index(5).mem_total_mib == 143771
    assert report.by_index(9) is None


def test_doc_example_without_roles_has_no_sibling_finding():
    report = classify(readings([(i, u, m) for i, m, u in DOC_EIGHT]))
    assert report.summary() == "GPUs 1, 4, 6 busy · 0, 2–3 low · 5, 7 idle (memory held)"
    assert report.lines()[:3] == ["GPUs 1, 4, 6 busy", "GPUs 0, 2–3 low", "GPUs 5, 7 idle (memory held)"]
    assert report.findings == ("GPUs 5, 7 idle with 43–75 GiB held",)


def test_roles_busy_and_idle_summary():
    rounds = [[(i, 100 if i < 5 else 0, 70000 if i < 5 else 71680) for i in range(8)]] * 3
    report = classify(readings(*rounds), {"target": range(5), "drafter": [5, 6, 7]})
    assert report.summary() == "target 0–4 busy · drafter 5–7 idle (memory held)"
    assert report.findings == ("drafter GPUs 5–7 idle with 70 GiB held",)


def test_summary_without_roles():
    rounds = [[(i, 100 if i < 5 else 0, 30000 if i < 5 else 4) for i in range(8)]] * 3
    report = classify(readings(*rounds))
    assert report.summary() == "GPUs 0–4 busy · 5–7 idle"
    assert report.lines() == ["GPUs 0–4 busy", "GPUs 5–7 idle"]
    assert report.findings == ()


def test_idle_gpu_holding_memory():
    report = classify(readings(*[[(3, 0, 71680), (4, 100, 71680)]] * 3))
    assert report.findings == ("GPU 3 idle with 70 GiB held",)
    assert report.summary() == "GPU 4 busy · 3 idle (memory held)"
    assert [g.index for g in report.idle_with_memory()] == [3]


def test_role_gpu_not_reported():
    report = classify(readings([(i, 100, 70000) for i in range(7)]), {"target": range(5), "drafter": [5, 6, 7]})
    assert "GPU 7 (drafter) not reported by nvidia-smi" in report.findings
    assert report.summary() == "target 0–4 busy · drafter 5–6 busy · 7 not reported"


def test_gpus_outside_roles_are_other():
    report = classify(readings([(0, 100, 70000), (1, 0, 4)]), {"target": [0]})
    assert report.by_index(1).role is None
    assert [g.index for g in report.in_role(None)] == [1]
    assert report.summary() == "target 0 busy · other 1 idle"


@pytest.mark.parametrize("mibs, uneven", [
    ([43747, 96871], True),  # two siblings: the small one is flagged, never the big one
    ([1500, 3000, 3000], False),  # a couple of GB apart: activations differ
    ([67133, 97051, 67247, 71411, 70925], False),  # the doc's target stages
    ([4, 70000, 70000], True),  # nothing loaded at all
    ([70000, 70000, 70000], False),
])
def test_uneven_memory_in_role(mibs, uneven):
    report = classify(readings([(i, 100, m) for i, m in enumerate(mibs)]), {"drafter": range(len(mibs))})
    flagged = [f for f in report.findings if "siblings" in f]
    assert len(flagged) == (1 if uneven else 0), report.findings
    if uneven:
        assert flagged[0].startswith("drafter GPU 0 holds ")


def test_error_only():
    report = classify(GpuReadings(error=MISSING), DOC_ROLES)
    assert report.summary() == f"GPUs: {MISSING}"
    assert report.findings == ()  # no "not reported" flood when nothing was reported
    assert report.lines() == [MISSING]
    assert classify(GpuReadings()).summary() == "GPUs: none reported"


def test_partial_readings_keep_the_error():
    got = parse_gpu_section(section((0, "0, 3133, 143771, 100"), (9, DRIVER)))
    report = classify(got)
    assert report.summary() == f"GPU 0 busy · {DRIVER_ERROR}"
    assert report.lines() == ["GPU 0 busy", DRIVER_ERROR]


def test_unknown_utilisation():
    report = classify(readings([(0, None, 4000)], [(0, None, 4000)]))
    assert report.summary() == "GPU 0 util unknown"
    assert report.by_index(0).utils == (None, None)


# ---------------------------------------------------------------- never raise

CSV_TOKENS = st.sampled_from(["0", "1", "7", "3133", "143771", "100", "101", " MiB", " %", ", ", ",", "\n", "\r",
                              "[N/A]", "N/A", "index", "memory.used [MiB]", "utilization.gpu [%]", "# sample 1 t=1 rc=",
                              "rc=0", "rc=9", "@missing", "\x00", "No devices were found", 'Field "x" is not a valid field',
                              "é", "-", ".", " "])
TEXT = st.one_of(st.text(), st.lists(CSV_TOKENS, max_size=60).map("".join))


@settings(max_examples=300, deadline=None)
@given(TEXT)
def test_parse_query_csv_never_raises(text):
    rows, error = parse_query_csv(text)
    assert all(s.util_pct is None or 0 <= s.util_pct <= 100 for s in rows)
    assert error is None or 0 < len(error) <= MAX_ERROR_CHARS


@settings(max_examples=300, deadline=None)
@given(TEXT)
def test_parse_gpu_section_never_raises(text):
    got = parse_gpu_section(text)
    assert got.error is None or 0 < len(got.error) <= MAX_ERROR_CHARS
    classify(got).summary()


NUMBER = st.one_of(st.none(), st.floats(allow_nan=True, allow_infinity=True), st.integers(-10, 10**400))
SAMPLE = st.builds(GpuSample, st.integers(-3, 12), NUMBER, NUMBER, NUMBER)
READINGS = st.builds(GpuReadings, st.lists(st.lists(SAMPLE, max_size=10).map(tuple), max_size=6).map(tuple),
                     st.one_of(st.none(), st.text(max_size=50)))
ROLES = st.one_of(st.none(), st.dictionaries(st.text(min_size=1, max_size=8),
                                             st.lists(st.integers(-3, 12), max_size=6), max_size=4))


@settings(max_examples=300, deadline=None)
@given(READINGS, ROLES)
def test_classify_never_raises(readings_, roles):
    report = classify(readings_, roles)
    report.summary()
    report.lines()
    report.idle_with_memory()
    assert {g.cls for g in report.gpus} <= {"busy", "oscillating", "low", "idle", "unknown"}
    assert [g.index for g in report.gpus] == readings_.indices


@given(st.sets(st.integers(0, 40)))
def test_format_indices_round_trips(indices):
    expanded = set()
    for part in filter(None, format_indices(indices).split(", ")):
        lo, _, hi = part.partition("–")
        expanded.update(range(int(lo), int(hi or lo) + 1))
    assert expanded == indices
