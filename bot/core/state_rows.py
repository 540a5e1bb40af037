"""Pure: the state file's rows read back as typed values; a row with a cell runbot could not have written is Unreadable, never a crash later.

SQLite's types are dynamic and its integrity check does not look at them: a `points` row can hold text
where a loss belongs, a blob for a phase, or 1e308 for a time, and it passes. Each cell is checked
here against what runbot writes (a type, a range), so one odd row costs that row and nothing else.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from bot.core.alerts import RunState, Status
from bot.core.history import MAX_COUNT, Point, RoleLoad, Tally, finite
from bot.core.learned import MAX_SIGHTINGS, CounterRule, Learned, Sighting
from bot.core.ledger import OPS, Incident, Message, Watch
from bot.core.verdict import Concern, Level, Phase

# Rows are small and many (500 runs x a probe a minute): a phase is stored as its place in this list.
# Append only, never reorder: the file's integers point into it.
PHASES = tuple(Phase)
MAX_CLOCK = 253_402_300_799  # 9999-12-31T23:59:59Z: a later time cannot be shown as a date
MAX_ID = 2**63 - 1  # SQLite's largest integer: a row id, a word's
MAX_INODE = (1 << 64) - 1  # inodes and file sizes: what stat can say
MAX_TEXT = 1 << 20  # runbot's largest cell is an outbox payload of a few KB; a MiB is someone else's
Row = Mapping[str, Any]
T = TypeVar("T")


class Unreadable(ValueError):
    """A row holding a value runbot could not have written: it is skipped (and counted), never loaded."""


def guarded(decode: Callable[..., T]) -> Callable[..., T]:
    """Whatever a decoder meets in an odd row (a missing key, a wrong type, JSON nested too deep) is Unreadable."""

    def checked(*args: Any) -> T:
        try:
            return decode(*args)
        except Unreadable:
            raise
        except (ValueError, TypeError, KeyError, IndexError, OverflowError, RecursionError) as exc:
            raise Unreadable(f"{type(exc).__name__}: {exc}") from None

    checked.__doc__, checked.__name__ = decode.__doc__, decode.__name__
    return checked


# --- cells -------------------------------------------------------------------------------------


def whole(v: Any, low: int = 0, high: int = MAX_COUNT) -> int:
    """An integer in [low, high], a count by default (a bool is not one: JSON's true is no count)."""
    if type(v) is not int or not low <= v <= high:
        raise Unreadable(f"not a whole number in [{low}, {high}]: {v!r:.40}")
    return v


def real(v: Any) -> float:
    """A finite number as runbot keeps them (|x| < 1e30: what bot.core.history lets into the memory)."""
    if type(v) not in (int, float) or finite(float(v)) is None:
        raise Unreadable(f"not a finite number: {v!r:.40}")
    return float(v)


def clock(v: Any) -> float:
    """A time on the bot's clock: seconds since 1970, before the year 10000."""
    if type(v) not in (int, float) or not (math.isfinite(v) and 0 <= v <= MAX_CLOCK):
        raise Unreadable(f"not a time: {v!r:.40}")
    return float(v)


def text(v: Any) -> str:
    if type(v) is not str or len(v) > MAX_TEXT:
        raise Unreadable(f"not text: {type(v).__name__}")
    return v


def flag(v: Any) -> bool:
    if type(v) is not bool:
        raise Unreadable(f"not true or false: {v!r:.40}")
    return v


def maybe(check: Callable[[Any], T], v: Any) -> T | None:
    """None stays None (a column that may be empty); anything else must pass `check`."""
    return None if v is None else check(v)


def _json(v: Any, kind: type) -> Any:
    value = json.loads(text(v))  # a nesting too deep for the parser is a RecursionError: guarded() says Unreadable
    if type(value) is not kind:
        raise Unreadable(f"not a JSON {kind.__name__}")
    return value


def concern(v: Any) -> Concern | None:
    """A concern's key ("thread_died:drafter-1"); one a newer runbot named loads as the closest this one knows."""
    return None if v is None else Concern.from_key(text(v))


# --- rows --------------------------------------------------------------------------------------


@guarded
def point(r: Row, words: Mapping[int, str]) -> Point:
    """A `points` row; `words` holds the file's units and role names by id (an id not there is a unit unknown)."""
    place = whole(r["phase"])
    gpus = tuple(_role(item, words) for item in (text(r["gpus"]) if r["gpus"] is not None else "").split(";") if item)
    unit = maybe(lambda v: whole(v, 0, MAX_ID), r["unit"])
    return Point(clock(whole(r["t"])), PHASES[place] if place < len(PHASES) else Phase.TRAINING,  # a newer runbot's phase
                 whole(r["level"], 0, max(Level)), maybe(whole, r["step"]), maybe(whole, r["total"]),
                 maybe(real, r["loss"]), maybe(real, r["rate"]), words.get(unit) if unit is not None else None,
                 whole(r["segment"]), gpus)


def _role(item: str, words: Mapping[int, str]) -> RoleLoad:
    """One "role:busy%:GiB" of a point's gpus (role a words id, GiB empty when unknown)."""
    role, busy, mem = item.split(":")
    if not (role.isdecimal() and busy.isdecimal() and role.isascii() and busy.isascii()):
        raise Unreadable(f"not role:busy:GiB: {item[:40]!r}")
    gib = real(float(mem)) if mem else None
    if (gib is not None and gib < 0) or int(busy) > 100:
        raise Unreadable(f"out of range: {item[:40]!r}")
    return RoleLoad(words.get(int(role), "GPUs"), int(busy) / 100, gib)


@guarded
def tally(r: Row) -> Tally:
    return Tally(whole(r["segment"]), clock(r["started"]), clock(r["last_t"]), maybe(whole, r["first_step"]),
                 maybe(whole, r["last_step"]), maybe(real, r["final_loss"]), maybe(real, r["best_loss"]),
                 real(r["rate_sum"]), whole(r["rate_n"]), maybe(text, r["unit"]))


@guarded
def learned(v: Any) -> Learned:
    """A run's learned format from its JSON (bot.core.learned.to_record's)."""
    r = _json(v, dict)
    sightings = r["sightings"]
    if type(sightings) is not list or len(sightings) > MAX_SIGHTINGS:
        raise Unreadable("not a list of sightings")
    counter = r["counter"]
    return Learned(
        inode=maybe(lambda x: whole(x, 0, MAX_INODE), r["inode"]),
        size=whole(r["size"], 0, MAX_INODE),
        counter=None if counter is None else CounterRule(text(counter[0]), whole(counter[1])),
        sightings=tuple(Sighting(text(t), tuple(real(x) for x in values), tuple(whole(i) for i in countable), flag(measured))
                        for t, values, countable, measured in sightings),
        news=text(r["news"]),
        news_since=maybe(clock, r["news_since"]),
    )


@guarded
def incident(r: Row) -> Incident:
    return Incident(text(r["run"]), whole(r["seq"]), text(r["channel"]), maybe(text, r["parent_ts"]),
                    clock(r["opened_at"]), concern(r["concern"]), maybe(clock, r["closed_at"]), maybe(whole, r["digest"]))


@guarded
def message(r: Row) -> Message:
    payload = _json(r["payload"], dict)  # {"text", "blocks"}, as the watchdog sends it
    if not isinstance(payload.get("text", ""), str) or not isinstance(payload.get("blocks") or [], list):
        raise Unreadable("a payload without text or blocks")
    if r["op"] not in OPS:
        raise Unreadable(f"not an outbox op: {r['op']!r:.40}")
    return Message(whole(r["id"], 0, MAX_ID), text(r["key"]), text(r["run"]), whole(r["seq"]), r["op"], payload,
                   clock(r["created_at"]), whole(r["attempts"]), maybe(clock, r["tried_at"]), maybe(text, r["last_error"]),
                   maybe(clock, r["sent_at"]), maybe(text, r["ts"]), whole(r["priority"], -MAX_COUNT), text(r["note"]))


@guarded
def watch(r: Row) -> Watch:
    return Watch(text(r["run"]), text(r["channel"]), text(r["ts"]), clock(r["started_at"]), maybe(text, r["user"]))


def _streaks(v: Any) -> tuple[tuple[Concern, int], ...]:
    if type(v) is not list or not all(type(pair) is list and len(pair) == 2 for pair in v):
        raise Unreadable("streaks are not [key, count] pairs")
    return tuple((Concern.from_key(text(key)), whole(n)) for key, n in v)


def _flips(v: Any) -> tuple[float, ...]:
    if type(v) is not list:
        raise Unreadable("flips are not a list")
    return tuple(clock(t) for t in v)


# Each RunState field as the JSON holds it (tests/test_state_rows.py checks every field has one).
STATE_FIELDS: dict[str, Callable[[Any], Any]] = {
    "status": lambda v: Status(text(v)), "concern": concern, "seq": whole, "announced": flag,
    "opened_at": lambda v: maybe(clock, v), "changed_at": lambda v: maybe(clock, v),
    "notified_at": lambda v: maybe(clock, v), "closed_at": lambda v: maybe(clock, v), "healthy": whole,
    "headline": text, "muted_until": lambda v: maybe(clock, v), "muted_by": lambda v: maybe(text, v),
    "streaks": _streaks, "bad": lambda v: maybe(flag, v), "flips": _flips, "flapping": flag,
}


@guarded
def state(v: Any) -> RunState:
    """A RunState from its JSON; fields a newer or older runbot wrote and this one lacks are ignored."""
    return state_of(_json(v, dict))


def state_of(values: Mapping[str, Any]) -> RunState:
    """A RunState from its fields by name (JSON's, or a schema-1 row's); a field not given keeps its default."""
    return RunState(**{name: STATE_FIELDS[name](v) for name, v in values.items() if name in STATE_FIELDS})
