"""No verdict changes (issue 21): real logs of the corpora, written out growing in chunks, probed at every chunk by the
real bash probe both in full and incrementally (told what the last look saw) — the same first line every time."""

from __future__ import annotations

import asyncio
from pathlib import Path

from bot.core.window_cache import WINDOW_BYTES
from bot.core.verdict import Verdict
from bot.probe.checkup import check_group_within
from bot.probe.scheduler import GROUP_MAX
from bot.probe.looks import Look
from bot.probe.replay import DefaultRun
from bot.probe.runners import LocalRunner
from tests.standins import set_age

FIXTURES = Path(__file__).parent / "fixtures"
CORPORA = ("public", "round3", "round4", "round5")
AGE_S = 300  # each chunk written five minutes "ago": both looks see one age, whatever the few ms between them


def chosen(n: int = 30, large: int = 6) -> list[Path]:
    """The `large` largest logs (their windows cross the cap) and the rest spread evenly over the corpora's names."""
    logs = sorted(p for c in CORPORA for p in (FIXTURES / c).glob("*/log"))
    big = sorted(logs, key=lambda p: (-p.stat().st_size, str(p)))[:large]
    rest = [p for p in logs if p not in big]
    return big + rest[:: max(1, len(rest) // (n - large))][: n - large]


def ends(size: int) -> list[int]:
    """Where each look finds the log: a first look, the same again, small growths cut mid-line (or mid-character),
    a big one, the end, the same again."""
    quarter, half = size // 4, size // 2
    marks, out = [quarter, quarter, quarter + 1000, half + 37, size, size], []
    for m in marks:
        out.append(max(out[-1] if out else 1, min(size, max(1, m))))
    return out


def test_incremental_looks_give_the_verdicts_of_full_looks(tmp_path):
    """The logs probed like a sweep's groups (check_group_within, GROUP_MAX runs a script): at each look every log
    grows to its next end, then one full look and one incremental look of them all."""
    logs = chosen()
    assert len(logs) == 30 and sum(p.stat().st_size > WINDOW_BYTES for p in logs) >= 6
    contents = [p.read_bytes() for p in logs]
    paths = [tmp_path / f"{i}.log" for i in range(len(logs))]
    runs = [DefaultRun(f"r{i}", str(p)) for i, p in enumerate(paths)]
    looks = [Look() for _ in runs]
    written = [0] * len(runs)
    full: dict[str, Verdict] = {}
    incr: dict[str, Verdict] = {}
    wrong = []
    for p in paths:
        p.write_bytes(b"")
    for at in range(len(ends(1))):
        for i, content in enumerate(contents):
            end = ends(len(content))[at]
            if end > written[i]:
                with paths[i].open("ab") as f:  # appended: the same inode, as a training job writes
                    f.write(content[written[i]:end])
                written[i] = end
            set_age(paths[i], AGE_S)
        full, incr = asyncio.run(both(runs, full, incr, looks))
        for i, (log, run) in enumerate(zip(logs, runs)):
            said = [(v.headline, v.level, v.phase) for v in (full[run.name], incr[run.name])]
            if said[0] != said[1]:
                wrong.append(f"{log.parent.parent.name}/{log.parent.name} look {at} at {written[i]} bytes: "
                             f"{said[0]} != {said[1]}")
            if looks[i].seen is not None and looks[i].seen.window != contents[i][:written[i]][-WINDOW_BYTES:]:
                wrong.append(f"{log.parent.name} look {at}: the window held is not the file's last bytes")
    assert wrong == []
    assert sum(look.seen is not None for look in looks) == len(looks)


async def both(runs: list[DefaultRun], full: dict[str, Verdict], incr: dict[str, Verdict],
               looks: list[Look]) -> tuple[dict[str, Verdict], dict[str, Verdict]]:
    """One look at every run in full and one incrementally, side by side."""
    return await asyncio.gather(look_at(runs, full, None), look_at(runs, incr, looks))


async def look_at(runs: list[DefaultRun], previous: dict[str, Verdict], looks: list[Look] | None) -> dict[str, Verdict]:
    """One look at every run, GROUP_MAX a probe, each run's previous verdict and learned format carried as a sweep does."""
    async def group(k: int) -> list[Verdict]:
        runs_k = runs[k:k + GROUP_MAX]
        return await check_group_within(runs_k, lambda run: LocalRunner(), timeout=30, previous=previous,
                                        learned={r.name: v.learned for r in runs_k if (v := previous.get(r.name))
                                                 and v.learned is not None},
                                        looks=looks[k:k + GROUP_MAX] if looks is not None else None)

    verdicts = [v for found in await asyncio.gather(*(group(k) for k in range(0, len(runs), GROUP_MAX))) for v in found]
    return {r.name: v for r, v in zip(runs, verdicts)}
