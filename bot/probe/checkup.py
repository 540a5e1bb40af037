"""Probe one run end to end: script -> Runner -> sections -> evidence -> verdict (shell)."""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import secrets
import time
from pathlib import Path
from collections.abc import Mapping, Sequence
from concurrent.futures import Executor
from typing import Callable, Protocol, TypeVar

from bot.core import humanize as hz
from bot.core.diagnose import RunPolicy, diagnose, unreachable
from bot.core.evidence import read_evidence
from bot.core.history import Point
from bot.core.learned import Learned
from bot.core.redact import printable
from bot.core.sections import Sections, moved_on, split_runs
from bot.core.window_cache import rebuild, remember
from bot.probe.looks import Look
from bot.probe.script import ProbeTarget, build_group_script, output_bound
from bot.probe.runners import RunResult, Runner
from bot.core.verdict import Verdict
from config.validate import compile_step_pattern

DEFAULT_TIMEOUT_S = 30.0
PROBE_GRACE_S = 5.0  # past the probe's own timeout, before its caller gives up on it
log = logging.getLogger(__name__)
T = TypeVar("T")


class CheckableRun(RunPolicy, ProbeTarget, Protocol):
    """A configured run: what both the probe and the diagnosis need."""


def verdict_from_output(run: CheckableRun, result: RunResult, nonce: str, previous: Verdict | None = None, *,
                        later: float = 0.0, history: Sequence[Point] = (), learned: Learned | None = None) -> Verdict:
    """Turn a finished probe into a verdict (pure; replays and tests run captured probes through it).
    `later`: read it that many seconds on, as if the run had frozen since."""
    [verdict] = verdicts_from_output([run], result, nonce, {run.name: previous} if previous else {}, later=later,
                                     histories={run.name: history}, learned={run.name: learned} if learned else None)
    return verdict


def verdicts_from_output(runs: Sequence[CheckableRun], result: RunResult, nonce: str,
                         previous: Mapping[str, Verdict] | None = None, *, later: float = 0.0,
                         histories: Mapping[str, Sequence[Point]] | None = None,
                         learned: Mapping[str, Learned] | None = None) -> list[Verdict]:
    """A group probe's verdicts, one per run in order: a failed round trip fails them all, anything else is
    each run's own (one unreadable log, one run the probe never reached, does not fail its neighbours).
    `learned`: each run's format as earlier looks learned it (bot.core.learned)."""
    return [part() for part in verdict_parts(runs, result, nonce, previous, later=later, histories=histories,
                                             learned=learned)]


def verdict_parts(runs: Sequence[CheckableRun], result: RunResult, nonce: str,
                  previous: Mapping[str, Verdict] | None = None, *, later: float = 0.0,
                  histories: Mapping[str, Sequence[Point]] | None = None,
                  learned: Mapping[str, Learned] | None = None, sections: Sequence[Sections] | None = None,
                  looks: Sequence[Look] | None = None) -> list[Callable[[], Verdict]]:
    """verdicts_from_output's work, one call per run (the output split already): a parse queue can put a
    person's parse between two runs of a sweep's group. `sections`: each run's, rebuilt already (else split from
    the result); `looks`: each run's Look, which keeps its parse of an unchanged log and learns what this look saw."""
    if result.failure:
        return [functools.partial(unreachable, run, result.failure, result.failure_kind) for run in runs]
    if result.truncated:  # more than an honest probe prints: what came back cannot be trusted to be the probe's
        why = (f"the probe's answer passed {hz.size(output_bound(len(runs)))} and was cut "
               "(does the container's bash or ps print more than asked?)")
        return [functools.partial(unreachable, run, why, "probe") for run in runs]
    previous, histories, learned = previous or {}, histories or {}, learned or {}

    def one(run: CheckableRun, sections: Sections, look: Look | None) -> Verdict:
        if look is not None:
            look.seen = remember(sections)
        sections = moved_on(sections, later)
        if "meta" not in sections.parts:
            err = result.stderr.decode("utf-8", "replace").strip().splitlines()
            why = err[-1] if err else f"exit status {result.exit_status}"
            return unreachable(run, f"the probe did not run: {why[:200]}", "probe")
        custom = compile_step_pattern(run.step_pattern) if run.step_pattern else None
        evidence = read_evidence(sections, run.log, custom, learned.get(run.name),
                                 text=look.read_text if look is not None else None)
        return diagnose(evidence, run, previous=previous.get(run.name), history=histories.get(run.name, ()))

    split = sections if sections is not None else split_runs(result.stdout, nonce, len(runs))
    return [functools.partial(one, run, part, look) for run, part, look in zip(runs, split, looks or [None] * len(runs))]


async def _looked(runs: Sequence[CheckableRun], runner: Runner, timeout: float, looks: Sequence[Look] | None,
                  ) -> list[tuple[list[int], RunResult, str, list[Sections] | None]]:
    """One round trip for `runs`, told what each run's Look saw (no Looks: full probes, as a saved probe must be);
    then each run's sections as a full probe would have sent them (bot.core.window_cache.rebuild). The runs whose
    log no longer holds the bytes seen (rewritten in place) are probed once more, in full, in a second round trip.
    Per round trip: the runs' places in `runs`, its result and nonce, their sections (None: read the result)."""
    seen = [look.seen for look in looks] if looks is not None else [None] * len(runs)
    nonce = secrets.token_hex(8)
    result = await runner.run(build_group_script(runs, nonce, seen=seen), timeout=timeout, limit=output_bound(len(runs)))
    if looks is None or result.failure or result.truncated:
        return [(list(range(len(runs))), result, nonce, None)]
    rebuilt = [rebuild(s, part) for s, part in zip(seen, split_runs(result.stdout, nonce, len(runs)))]
    again = [i for i, part in enumerate(rebuilt) if part is None]
    done = [i for i, part in enumerate(rebuilt) if part is not None]
    out = [(done, result, nonce, [rebuilt[i] for i in done])] if done else []
    if again:
        for i in again:
            looks[i].seen = None
        out += await _looked([runs[i] for i in again], runner, timeout, None)
        out[-1] = ([again[i] for i in out[-1][0]], *out[-1][1:])
    return out


def _parts(runs: Sequence[CheckableRun], probes, looks: Sequence[Look] | None, **kwargs) -> list[Callable[[], Verdict]]:
    """verdict_parts for each round trip of _looked, back in the runs' order."""
    parts: list[Callable[[], Verdict] | None] = [None] * len(runs)
    for where, result, nonce, sections in probes:
        some = [runs[i] for i in where]
        for i, part in zip(where, verdict_parts(some, result, nonce, sections=sections,
                                                looks=[looks[i] for i in where] if looks is not None else None,
                                                **kwargs)):
            parts[i] = part
    return parts  # type: ignore[return-value]


async def check(
    run: CheckableRun,
    runner: Runner,
    *,
    timeout: float = DEFAULT_TIMEOUT_S,
    previous: Verdict | None = None,
    save_probe: Path | None = None,
    history: Sequence[Point] = (),
    parser: Executor | None = None,
    learned: Learned | None = None,
    look: Look | None = None,
) -> Verdict:
    """Probe `run` once through `runner` and diagnose what came back (in `parser`, a worker thread). `look`: what
    the last look saw of the run's log (the probe then sends only what changed; a saved probe is always full)."""
    looks = [look] if look is not None and save_probe is None else None
    probes = await _looked([run], runner, timeout, looks)
    if save_probe is not None:
        save_capture(save_probe, run.name, probes[0][2], probes[0][1])
    # Parsing a window takes a few ms of CPU; the bot and its watchdog run hundreds of these on
    # the event loop that must also ack Slack within 3 s, so it happens in a worker thread.
    return await _off_loop(parser, lambda: _parts([run], probes, [look] if look is not None else None,
                                                  previous={run.name: previous} if previous else {},
                                                  histories={run.name: history},
                                                  learned={run.name: learned} if learned else None)[0]())


async def _off_loop(parser: Executor | None, work: Callable[[], T]) -> T:
    """Run the parse in a worker thread: `parser` (the scheduler keeps one for questions and one for sweeps,
    so a sweep's parses neither queue ahead of a question's nor crowd the event loop out of the GIL),
    else the loop's default pool."""
    return await asyncio.get_running_loop().run_in_executor(parser, work)


def _failed(exc: BaseException) -> str:
    """An unexpected failure in words for a verdict: printable, redacted, then cut (its text may quote a log)."""
    return hz.trim(printable(f"the probe failed: {type(exc).__name__}: {exc}"), 300)


async def check_within(
    run: CheckableRun,
    runner_for: Callable[[CheckableRun], Runner],
    *,
    timeout: float,
    previous: Verdict | None = None,
    history: Sequence[Point] = (),
    save_probe: Path | None = None,
    parser: Executor | None = None,
    learned: Learned | None = None,
    look: Look | None = None,
) -> Verdict:
    """check(), but it always answers: a hard deadline a little past the probe's own timeout, and
    any failure (setting up the runner included) as an unreachable verdict, never an exception."""
    try:
        return await asyncio.wait_for(check(run, runner_for(run), timeout=timeout, previous=previous, history=history,
                                            save_probe=save_probe, parser=parser, learned=learned, look=look),
                                      timeout + PROBE_GRACE_S)
    except asyncio.TimeoutError:
        return unreachable(run, f"the probe of {run.name} gave no answer within {timeout + PROBE_GRACE_S:g} s", "timeout")
    except Exception as exc:  # noqa: BLE001 - said in the verdict, logged for us
        log.exception("probe of %s failed", run.name)
        return unreachable(run, _failed(exc), "probe")


async def check_group_within(
    runs: Sequence[CheckableRun],
    runner_for: Callable[[CheckableRun], Runner],
    *,
    timeout: float,
    previous: Mapping[str, Verdict] | None = None,
    histories: Mapping[str, Sequence[Point]] | None = None,
    parser: Executor | None = None,
    learned: Mapping[str, Learned] | None = None,
    looks: Sequence[Look] | None = None,
) -> list[Verdict]:
    """Runs that share a container (or a host) probed by one script in one round trip; always answers, like
    check_within: a deadline a little past the timeout, any failure as every run's unreachable verdict.
    `looks`: each run's Look (see check)."""
    try:
        probes = await asyncio.wait_for(_looked(runs, runner_for(runs[0]), timeout, looks), timeout + PROBE_GRACE_S)
        parts = await _off_loop(parser, lambda: _parts(runs, probes, looks, previous=previous, histories=histories,
                                                       learned=learned))
        return [await _off_loop(parser, part) for part in parts]  # one run at a time: a question's parse may go between
    except asyncio.TimeoutError:
        why, kind = f"the probe of {len(runs)} runs gave no answer within {timeout + PROBE_GRACE_S:g} s", "timeout"
    except Exception as exc:  # noqa: BLE001 - said in the verdicts, logged for us
        log.exception("probe of %s failed", ", ".join(r.name for r in runs))
        why, kind = _failed(exc), "probe"
    return [unreachable(run, why, kind) for run in runs]


def save_capture(folder: Path, run_name: str, nonce: str, result: RunResult) -> Path:
    """Keep a probe's raw output (for replays in tests): <run>-<ms>.probe plus a .json beside it."""
    folder.mkdir(parents=True, exist_ok=True)
    stem = folder / f"{run_name}-{int(time.time() * 1000)}"
    stem.with_suffix(".probe").write_bytes(result.stdout)
    meta = {
        "run": run_name,
        "nonce": nonce,
        "exit_status": result.exit_status,
        "failure": result.failure,
        "failure_kind": result.failure_kind,
        "elapsed_s": round(result.elapsed_s, 4),
        "stderr": result.stderr.decode("utf-8", "replace")[-4000:],
        "saved_at": time.time(),
    }
    stem.with_suffix(".json").write_text(json.dumps(meta, indent=1))
    return stem
