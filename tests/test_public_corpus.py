"""The public corpus: real logs other teams wrote, probed by the real probe and scored against the first line
an on-call engineer needs (tests/fixtures/public/README.md). Prints the figure; holds runbot to it."""

from __future__ import annotations

import asyncio
import re
import shutil
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from bot.core.verdict import Level, Phase, Verdict
from bot.probe.checkup import check
from bot.probe.runners import LocalRunner
from config.durations import parse_duration
from tests.standins import set_age, writer_holding

CORPUS = Path(__file__).parent / "fixtures" / "public"
LEVELS = {"ok": Level.OK, "note": Level.NOTE, "warn": Level.WARN, "crit": Level.CRIT}
HUNG_AGE = "15m"  # past silence_after (10m), inside loading_grace (45m): only a training-silence rule fires


@dataclass
class Run:
    """runbot's defaults, as a user who set nothing gets them."""

    log: str
    name: str = "corpus"
    step_pattern: str | None = None
    gpu_samples: int = 1
    silence_after: float | None = 600.0
    loading_grace: float = 2700.0
    gpus: dict = field(default_factory=dict)

    @property
    def roles(self):
        return self.gpus


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


def moments() -> list[Moment]:
    out = []
    for folder in sorted(p for p in CORPUS.iterdir() if p.is_dir()):
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


MOMENTS = moments()


def judge(moment: Moment, verdict: Verdict) -> list[str]:
    """Why the first line is wrong for this moment (empty: right)."""
    wrong = []
    if verdict.phase.value != moment.phase:
        wrong.append(f"phase {verdict.phase.value!r}, not {moment.phase!r}")
    if verdict.level is not LEVELS[moment.level]:
        wrong.append(f"level {verdict.level.name}, not {moment.level.upper()}")
    line = verdict.headline.casefold()
    wrong += [f"lacks {s!r}" for s in moment.must_include if s.casefold() not in line]
    wrong += [f"says {s!r}" for s in moment.must_exclude if s.casefold() in line]
    return wrong


async def probe(moment: Moment, folder: Path) -> Verdict:
    log = folder / "train.log"
    shutil.copyfile(CORPUS / moment.case / "log", log)
    set_age(log, parse_duration(moment.age, "age"))
    run = Run(str(log))
    if moment.writer == "alive":
        with writer_holding(log):
            set_age(log, parse_duration(moment.age, "age"))
            return await check(run, LocalRunner())
    return await check(run, LocalRunner())


@pytest.fixture(scope="module")
def verdicts(tmp_path_factory) -> dict[str, Verdict]:
    async def all_of_them() -> list[Verdict]:
        gate = asyncio.Semaphore(8)

        async def one(i: int, m: Moment) -> Verdict:
            async with gate:
                return await probe(m, tmp_path_factory.mktemp(f"m{i}"))

        return await asyncio.gather(*(one(i, m) for i, m in enumerate(MOMENTS)))

    return {m.id: v for m, v in zip(MOMENTS, asyncio.run(all_of_them()))}


def test_the_corpus_is_what_the_issue_asks_for():
    cases = {m.case for m in MOMENTS}
    assert len(cases) >= 60
    families = {re.match(r"[a-z]+", c)[0] for c in cases}
    assert families == {"hf", "dist", "misc"}


def test_the_first_lines_are_right(verdicts, capsys):
    misses = [(m, verdicts[m.id], why) for m in MOMENTS if (why := judge(m, verdicts[m.id]))]
    right = len(MOMENTS) - len(misses)
    with capsys.disabled():
        print(f"\npublic corpus: {right}/{len(MOMENTS)} first lines right ({100 * right / len(MOMENTS):.1f} %), "
              f"{len({m.case for m in MOMENTS})} logs")
        for m, v, why in misses:
            print(f"  MISS {m.id}: {'; '.join(why)}\n       want: {m.headline}\n       got:  {v.headline}")
    assert right / len(MOMENTS) >= 0.95


def test_no_false_crit_on_a_healthy_or_cleanly_finished_run(verdicts):
    false = [m.id for m in MOMENTS if m.level != "crit" and verdicts[m.id].level is Level.CRIT]
    assert false == []


def test_every_hung_run_is_alerted_within_silence_after(verdicts):
    hung = [m for m in MOMENTS if m.phase == "silent"]
    assert len(hung) >= 20
    missed = [m.id for m in hung if verdicts[m.id].phase is not Phase.SILENT or verdicts[m.id].level is not Level.CRIT]
    assert missed == []
