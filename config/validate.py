"""Checks of single configuration values, and the one-line ConfigError that names a bad one."""

from __future__ import annotations

import json
import math
import os
import re
import warnings
from pathlib import Path
from typing import Any, NoReturn, Protocol, Sequence

import re2

# Pure: values are only checked here, never built into a shell command, so that whatever
# uses them later can quote them.

MAX_STEP_PATTERN = 500


class ConfigError(Exception):
    """A configuration fault. `str()` is one line: `FILE: KEY: FAULT` (or `FILE: FAULT`)."""

    def __init__(self, source: str | os.PathLike[str], key: str, fault: str) -> None:
        super().__init__(str(source), key, fault)
        self.source = str(source)
        self.key = key
        self.fault = fault

    def __str__(self) -> str:
        parts = [self.source, self.key, self.fault] if self.key else [self.source, self.fault]
        return one_line(": ".join(parts))


class ConfigFaults(ConfigError):
    """Every fault found in one file, in the order the walk met them. Its own fields and a one-line
    `str()` are the first fault's (with how many more), so code that reports one fault still can;
    `runbot check-config` numbers them all."""

    def __init__(self, faults: Sequence[ConfigError]) -> None:
        first = faults[0]
        super().__init__(first.source, first.key, first.fault)
        self.faults = tuple(faults)

    def __str__(self) -> str:
        more = len(self.faults) - 1
        first = super().__str__()
        return f"{first} (and {more} more: `runbot check-config` lists them)" if more else first


def faults_of(exc: ConfigError) -> tuple[ConfigError, ...]:
    """The faults a ConfigError stands for: several when a walk gathered them, else itself."""
    return exc.faults if isinstance(exc, ConfigFaults) else (exc,)


_NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
_NAME_RULE = 'letters, digits, "_", "." and "-", starting with a letter or digit, at most 64'
_ROLE_RE = re.compile(r"[A-Za-z0-9_-]{1,64}")
_ADDRESS_RE = re.compile(r"[A-Za-z0-9._:%][A-Za-z0-9._:%-]{0,252}")
_USER_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_.-]{0,31}")
_JUMP_RE = re.compile(
    r"(?:(?P<user>[A-Za-z_][A-Za-z0-9_.-]{0,31})@)?"
    r"(?P<host>[A-Za-z0-9._][A-Za-z0-9._-]{0,252}|\[[0-9A-Fa-f:.%]+\])"
    r"(?::(?P<port>[0-9]{1,5}))?"
)
_CHANNEL_ID_RE = re.compile(r"[CG][A-Z0-9]{2,20}")
_ACCESS_CHANNEL_RE = re.compile(r"[CGD][A-Z0-9]{2,20}")  # a DM with the bot has a D… id
_CHANNEL_NAME_RE = re.compile(r"#[a-z0-9][a-z0-9_-]{0,79}")
_USER_ID_RE = re.compile(r"[UW][A-Z0-9]{2,20}")
_MAX_CT = 999_999_999  # Proxmox's largest VMID


class Validator:
    """Checks one value at a key path; its first fault raises a ConfigError naming file and key."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.base = os.path.abspath(path.parent)  # relative paths in the file are anchored here

    def fail(self, key: str, fault: str) -> NoReturn:
        raise ConfigError(self.path, key, fault)

    def table(self, value: object, key: str) -> dict[str, Any]:
        if not isinstance(value, dict):
            self.fail(key, f"must be a table, not {kind_of(value)}")
        return value

    def name(self, name: str, key: str, what: str) -> None:
        if not _NAME_RE.fullmatch(name):
            self.fail(key, f"bad {what} name {show(name)} ({_NAME_RULE})")

    def text(self, value: object, key: str) -> str:
        if not isinstance(value, str):
            self.fail(key, f"must be a string, not {kind_of(value)}")
        if not value.strip():
            self.fail(key, "is empty")
        if not value.isprintable():
            self.fail(key, f"{show(value)} holds a control character (a newline?)")
        return value

    def user(self, value: object, key: str) -> str:
        user = self.text(value, key)
        if not _USER_RE.fullmatch(user):
            self.fail(key, f"bad user name {show(user)}")
        return user

    def integer(self, value: object, key: str, low: int, high: int) -> int:
        if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
            self.fail(
                key, f"bad {key.rsplit('.', 1)[-1]} {show(value)} (a whole number from {low} to {high})"
            )
        return value

    def boolean(self, value: object, key: str) -> bool:
        if not isinstance(value, bool):
            self.fail(key, f"must be true or false, not {show(value)}")
        return value

    def fraction(self, value: object, key: str) -> float:
        """A share strictly between 0 and 1: 0.6, or "60%"."""
        if isinstance(value, str) and value.strip().endswith("%"):
            try:
                value = float(value.strip()[:-1]) / 100
            except ValueError:
                pass
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < 1:
            self.fail(key, f"bad {key.rsplit('.', 1)[-1]} {show(value)} (a share between 0 and 1, e.g. 0.6 or \"60%\")")
        return float(value)

    def container(self, value: object, key: str) -> int:
        if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= _MAX_CT:
            self.fail(
                key,
                f"bad CT id {show(value)} (a positive whole number, e.g. 200; "
                "leave container out to run on the host itself)",
            )
        return value

    def address(self, value: object, key: str) -> str:
        address = self.text(value, key)
        if not _ADDRESS_RE.fullmatch(address):
            self.fail(
                key,
                f"bad address {show(address)} "
                "(a host name or IP address; no spaces, user@ or shell characters)",
            )
        return address

    def jump(self, value: object, key: str) -> str:
        jump = self.text(value, key)
        found = _JUMP_RE.fullmatch(jump)
        if not found or (found["port"] and not 1 <= int(found["port"]) <= 65535):
            self.fail(key, f'bad jump host {show(jump)} (use "host", "user@host" or "user@host:port")')
        return jump

    def file(self, value: object, key: str) -> str:
        path = os.path.expanduser(self.text(value, key))
        return os.path.normpath(os.path.join(self.base, path))

    def channel(self, value: object, key: str) -> str:
        channel = self.text(value, key)
        if not (_CHANNEL_ID_RE.fullmatch(channel) or _CHANNEL_NAME_RE.fullmatch(channel)):
            self.fail(
                key,
                f'bad channel {show(channel)} (a channel id like "C0123456789", or "#name" in lower case)',
            )
        return channel

    def ids(self, value: object, key: str, pattern: re.Pattern[str], what: str) -> frozenset[str]:
        if not isinstance(value, list):
            self.fail(key, f"must be a list of Slack {what} ids, not {kind_of(value)}")
        for item in value:
            if not isinstance(item, str) or not pattern.fullmatch(item):
                example = "U0123ABCD" if what == "user" else "C0123456789"
                names = (
                    " (channel names cannot be checked; use the id)"
                    if isinstance(item, str) and item.startswith("#")
                    else ""
                )
                self.fail(key, f'bad {what} id {show(item)} (Slack {what} ids look like "{example}"){names}')
        return frozenset(value)

    def user_ids(self, value: object, key: str) -> frozenset[str]:
        return self.ids(value, key, _USER_ID_RE, "user")

    def channel_ids(self, value: object, key: str) -> frozenset[str]:
        return self.ids(value, key, _ACCESS_CHANNEL_RE, "channel")

    def gpus(self, value: object, key: str) -> tuple[tuple[str, tuple[int, ...]], ...]:
        """Each role checked on its own, every fault kept: a bad first role must not hide a GPU in two roles."""
        tbl = self.table(value, key)
        seen: dict[int, str] = {}
        roles, faults = [], []
        for role, indices in tbl.items():
            try:
                roles.append((role, self.role(role, indices, key, seen)))
            except ConfigError as fault:
                faults.append(fault)
        if faults:
            raise ConfigFaults(faults)
        return tuple(roles)

    def role(self, role: str, indices: object, key: str, seen: dict[int, str]) -> tuple[int, ...]:
        """One role's GPU indices; `seen` (index -> role) collects them across the roles."""
        if not _ROLE_RE.fullmatch(role):
            self.fail(key, f'bad role name {show(role)} (letters, digits, "_" and "-")')
        at = f"{key}.{role}"
        if not isinstance(indices, list):
            self.fail(at, f"must be a list of GPU indices like [0, 1], not {kind_of(indices)}")
        if not indices:
            self.fail(at, "is empty (list the role's GPU indices, like [0, 1])")
        for index in indices:
            if isinstance(index, bool) or not isinstance(index, int) or index < 0:
                self.fail(at, f"bad GPU index {show(index)} (a whole number from 0)")
            if index in seen:
                owner = seen[index]
                self.fail(at, f"GPU {index} listed twice" if owner == role else f"GPU {index} is already in role {show(owner)}")
            seen[index] = role
        return tuple(indices)

    def step_pattern(self, value: object, key: str) -> str:
        pattern = self.text(value, key)
        if len(pattern) > MAX_STEP_PATTERN:
            self.fail(key, f"too long ({len(pattern)} characters; at most {MAX_STEP_PATTERN})")
        fault = _ere_fault(pattern)
        if fault:
            self.fail(key, f"{show(pattern)}: {fault}")
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("error")  # "possible nested set" and the like
                re.compile(pattern)  # Python's messages say better what is wrong with a pattern
        except (re.error, Warning, OverflowError, RecursionError) as exc:
            self.fail(key, f"{show(pattern)} is not a regular expression: {getattr(exc, 'msg', exc)}")
        try:
            compiled = compile_step_pattern(pattern)
        except re2.error as exc:
            self.fail(key, f"{show(pattern)}: RE2, the linear-time engine runbot matches it with, refuses it: {_re2_message(exc)}")
        if compiled.search("") is not None:
            self.fail(key, f"{show(pattern)} matches every line (even an empty one)")
        return pattern


class LinearPattern(Protocol):
    """What the parser uses of a compiled step pattern (an RE2 regexp)."""

    def search(self, text: str) -> object | None: ...


# RE2 matches in time linear in the line's length whatever the pattern (no backtracking), so a
# pattern such as (a+)+$ cannot freeze the bot on one long line; its memory is bounded too, and a
# pattern that needs more is refused at load time rather than failing on a log line later.
_RE2_OPTIONS = re2.Options()
_RE2_OPTIONS.log_errors = False  # refusals are said once, in the config's own words
_RE2_OPTIONS.max_mem = 8 << 20


def compile_step_pattern(pattern: str) -> LinearPattern:
    """A run's step_pattern for the Python side of the probe: RE2, never the backtracking `re`."""
    return re2.compile(pattern, options=_RE2_OPTIONS)


def _re2_message(exc: Exception) -> str:
    said = exc.args[0] if exc.args else exc
    return (said.decode("utf-8", "replace") if isinstance(said, bytes) else str(said)) or "refused by RE2"


_INTERVAL_RE = re.compile(r"\{(?:[0-9]{1,3}(?:,[0-9]{0,3})?|,[0-9]{1,3})\}")  # {2} {1,3} {2,} {,3}


def _ere_fault(pattern: str) -> str | None:
    """Why `pattern` would mean something else to POSIX `grep -E` than to Python, or None.

    The probe filters the log with grep -E on the far side and the parser reads the
    lines with Python `re`: a step pattern must mean the same to both.
    """
    i, n, after_quantifier = 0, len(pattern), False
    while i < n:
        c = pattern[i]
        if c == "\\":
            nxt = pattern[i + 1 : i + 2]
            # \d \D \w \W \s \S are rewritten as bracket classes for grep (formats.step_grep_ere).
            if nxt.isascii() and nxt.isalnum() and nxt not in "dDwWsSb":
                return f"grep -E has no \\{nxt} (escape only punctuation; \\d, \\w, \\s and \\b are fine)"
            i, after_quantifier = i + 2, False
            continue
        if c == "[":
            j = i + 1
            if pattern[j : j + 1] == "^":
                j += 1
            if pattern[j : j + 1] == "]":
                j += 1
            while j < n and pattern[j] != "]":
                if pattern[j] == "\\":
                    return (
                        "inside [...] grep -E reads a backslash as itself "
                        r"(write [.] rather than [\.], [0-9] rather than [\d])"
                    )
                if pattern[j] == "[" and pattern[j + 1 : j + 2] in (":", ".", "="):
                    return "Python does not know POSIX classes like [[:digit:]] (use [0-9])"
                j += 1
            i, after_quantifier = j + 1, False
            continue
        if c == "(" and pattern[i + 1 : i + 2] == "?":
            return "grep -E has no (?...) groups (use plain (...))"
        if c in "*+?" and after_quantifier:
            return "grep -E has no lazy or possessive quantifiers (*?, +?, ??, *+)"
        if c == "{":
            interval = _INTERVAL_RE.match(pattern, i)
            if not interval or max(int(n) for n in re.findall("[0-9]+", interval[0])) > 255:
                return r"a { must start a repeat count like {2} or {1,3}, at most 255 (write \{ for a brace)"
            i, after_quantifier = interval.end(), True
            continue
        after_quantifier = c in "*+?"
        i += 1
    return None


# --- showing values in messages -------------------------------------------------------------
# Shared by every configuration message (durations and unknown runs too), so that a value
# reads the same wherever it is reported.

_BARE_KEY_RE = re.compile(r"[A-Za-z0-9_-]+")


def parse_jump(spec: str) -> tuple[str | None, str, int]:
    """`"[user@]host[:port]"` (validated by Validator.jump) as (user or None, host, port); v6 brackets dropped."""
    found = _JUMP_RE.fullmatch(spec)
    if found is None:
        raise ValueError(f"bad jump host {show(spec)}")
    host = found["host"][1:-1] if found["host"].startswith("[") else found["host"]
    return found["user"], host, int(found["port"] or 22)


def dotted(*parts: str) -> str:
    """A TOML key path, quoting the parts that need it: runs."v1 final".log."""
    return ".".join(p if _BARE_KEY_RE.fullmatch(p) else show(p) for p in parts)


def show(value: object) -> str:
    """A value as TOML would spell it, short and on one line."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        text = value if len(value) <= 60 else value[:57] + "..."
        return one_line(json.dumps(text, ensure_ascii=False))
    if isinstance(value, int):
        return repr(value) if abs(value) < 10**18 else "a huge number"
    if isinstance(value, float):
        return repr(value) if math.isfinite(value) else str(value)
    return kind_of(value)


def kind_of(value: object) -> str:
    """What sort of TOML value this is, for "must be X, not Y" messages."""
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int):
        return "an integer"
    if isinstance(value, float):
        return "a number"
    if isinstance(value, str):
        return f"the string {show(value)}"
    if isinstance(value, list):
        return "a list"
    if isinstance(value, dict):
        return "a table"
    return "a date/time"


def one_line(text: str) -> str:
    """Escape anything that a terminal or str.splitlines() would break a line at."""
    return "".join(c if c.isprintable() else f"\\u{ord(c):04x}" for c in text)
