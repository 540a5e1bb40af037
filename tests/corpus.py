"""Scoring first lines against what an on-call engineer needs (tests/fixtures/public/README.md): moments read
from case files, the real probe run on a copy of each log, and the judgement of each verdict."""

from __future__ import annotations

import asyncio
import shutil
import tomllib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from bot.core.verdict import Level, Verdict
from bot.probe.checkup import check
from bot.probe.replay import DefaultRun
from bot.probe.runners import LocalRunner
from config.durations import parse_duration
from tests.standins import set_age, writer_holding

LEVELS = {"ok": Level.OK, "note": Level.NOTE, "warn": Level.WARN, "crit": Level.CRIT}
HUNG_AGE = "15m"  # past silence_after (10m), inside loading_grace (45m): only a training-silence rule fires


@dataclass(frozen=True)
class Moment:
    case: str
    writer: str
    age: str
    phase: str
    level: str
    headline: str
    must_include: tuple[str, ...]
    must_exclude: tuple[str, ...]
    derived: bool = False  # the test's own "moved on" copy of a live training moment

    @property
    def id(self) -> str:
        return f"{self.case}@{self.writer}-{self.age}" + ("-moved-on" if self.derived else "")


def moments(corpus: Path) -> list[Moment]:
    """Every moment of every case, and for each live training moment its copy 15 minutes on."""
    out = []
    for folder in sorted(p for p in corpus.iterdir() if p.is_dir()):
        case = tomllib.loads((folder / "case.toml").read_text())
        for m in case["moment"]:
            moment = Moment(folder.name, m["writer"], m["age"], m["phase"], m["level"], m["headline"],
                            tuple(m.get("must_include", ())), tuple(m.get("must_exclude", ())))
            out.append(moment)
            if moment.phase == "training" and moment.writer == "alive":
                # Nothing new for 15 minutes while the process lives: a hang, whatever the trainer.
                # The live line's words to avoid ("silent", "no steps yet") are not this one's.
                out.append(Moment(folder.name, "alive", HUNG_AGE, "silent", "crit", "silent 15 min — …",
                                  moment.must_include, (), derived=True))
    return out


def judge(phase: str, level: str, must_include: Sequence[str], must_exclude: Sequence[str], verdict: Verdict) -> list[str]:
    """Why the first line is wrong for this moment (empty: right)."""
    wrong = []
    if verdict.phase.value != phase:
        wrong.append(f"phase {verdict.phase.value!r}, not {phase!r}")
    if verdict.level is not LEVELS[level]:
        wrong.append(f"level {verdict.level.name}, not {level.upper()}")
    line = verdict.headline.casefold()
    wrong += [f"lacks {s!r}" for s in must_include if s.casefold() not in line]
    wrong += [f"says {s!r}" for s in must_exclude if s.casefold() in line]
    return wrong


def misread(moment: dict, verdict: Verdict) -> str:
    """A device moment's expectation (`<job>/expected.toml`) against the first line: what it got wrong, with both
    lines; "" when it is right."""
    wrong = judge(moment["phase"], moment["level"], moment.get("must_include", ()), moment.get("must_exclude", ()), verdict)
    return f"{'; '.join(wrong)}\n  want: {moment['headline']}\n  got:  {verdict.headline}" if wrong else ""


def judge_moment(moment: Moment, verdict: Verdict) -> list[str]:
    return judge(moment.phase, moment.level, moment.must_include, moment.must_exclude, verdict)


async def probe(corpus: Path, moment: Moment, folder: Path) -> Verdict:
    """The real probe on a copy of the case's log, its mtime `age` ago, a live writer holding it or none."""
    log = folder / "train.log"
    shutil.copyfile(corpus / moment.case / "log", log)
    set_age(log, parse_duration(moment.age, "age"))
    run = DefaultRun("corpus", str(log))  # runbot's defaults, as a user who set nothing gets them
    if moment.writer == "alive":
        with writer_holding(log):
            set_age(log, parse_duration(moment.age, "age"))
            return await check(run, LocalRunner())
    return await check(run, LocalRunner())


def probe_all(corpus: Path, all_moments: Sequence[Moment], mktemp: Callable[[str], Path]) -> dict[str, Verdict]:
    async def run() -> list[Verdict]:
        gate = asyncio.Semaphore(8)

        async def one(i: int, m: Moment) -> Verdict:
            async with gate:
                return await probe(corpus, m, mktemp(f"m{i}"))

        return await asyncio.gather(*(one(i, m) for i, m in enumerate(all_moments)))

    return {m.id: v for m, v in zip(all_moments, asyncio.run(run()))}


def report(name: str, all_moments: Sequence[Moment], verdicts: dict[str, Verdict]) -> tuple[int, list[str]]:
    """(right, the lines saying what was missed)."""
    misses = [(m, verdicts[m.id], why) for m in all_moments if (why := judge_moment(m, verdicts[m.id]))]
    right = len(all_moments) - len(misses)
    lines = [f"{name}: {right}/{len(all_moments)} first lines right ({100 * right / len(all_moments):.1f} %), "
             f"{len({m.case for m in all_moments})} logs"]
    lines += [f"  MISS {m.id}: {'; '.join(why)}\n       want: {m.headline}\n       got:  {v.headline}" for m, v, why in misses]
    return right, lines
