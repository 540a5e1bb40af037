"""The registry: one TOML file -> validated hosts, runs, access rules and bot settings.

Pure validation. Reading the file (in `load_registry`) is the only IO; nothing here builds
a shell command — values are only checked, so that whatever uses them later can quote them.
Every fault is a `ConfigError` whose message is one line naming the file, the key and what
is wrong. docs/configuration.md is the user-facing reference for every key.
"""

from __future__ import annotations

import difflib
import json
import math
import os
import re
import tomllib
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any, NoReturn

LOCAL = "local"  # the host name meaning "this machine"

DEFAULT_SILENCE_AFTER = 600.0  # "10m"
DEFAULT_LOADING_GRACE = 2700.0  # "45m"
DEFAULT_GPU_SAMPLES = 5
MAX_DURATION = 365 * 86400.0
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
        return _one_line(": ".join(parts))


class UnknownRun(LookupError):
    """No run matches a name, or a prefix matches several. `str()` says which runs exist."""

    def __init__(self, query: str, known: list[str], ambiguous: list[str] | None = None) -> None:
        super().__init__(query, known, ambiguous or [])
        self.query = query
        self.known = list(known)
        self.ambiguous = list(ambiguous or [])

    def __str__(self) -> str:
        if self.ambiguous:
            return _one_line(
                f"{_show(self.query)} matches several runs: {', '.join(self.ambiguous)} (say which)"
            )
        known = f"known: {', '.join(self.known)}" if self.known else "no runs are configured"
        if not self.query:
            return f"which run? ({known})"
        return _one_line(f"unknown run {_show(self.query)} ({known})")


# --- the values ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Host:
    """A machine reached over SSH (a Proxmox node, or any Linux box)."""

    name: str
    address: str
    user: str = "root"
    port: int = 22
    key: str | None = None  # private key file; None: ssh-agent, then the usual key files
    known_hosts: str | None = None  # None: the usual known_hosts files
    jump: str | None = None  # "[user@]host[:port]", validated
    connect_timeout: float = 10.0
    command_timeout: float = 60.0
    keepalive: float = 30.0  # seconds between keepalives; 0 = off
    max_channels: int = 8  # concurrent SSH sessions on one connection (1..64)


@dataclass(frozen=True)
class Run:
    """One training run: where its log is, how to read it, who hears about it."""

    name: str
    host: str  # a Host name, or LOCAL
    container: int | None  # Proxmox CT id; None: the host itself
    log: str  # absolute path (inside the container when there is one)
    step_pattern: str | None = None  # extra progress-line regex (Python re and grep -E alike)
    alert_channel: str | None = None  # run's own, else [defaults], else [bot]
    silence_after: float | None = DEFAULT_SILENCE_AFTER  # None: "auto" (learned from steps)
    loading_grace: float = DEFAULT_LOADING_GRACE
    gpu_samples: int = DEFAULT_GPU_SAMPLES
    gpus: tuple[tuple[str, tuple[int, ...]], ...] = ()  # (role, GPU indices), in file order
    users: frozenset[str] | None = None  # None: the global [access] list applies
    channels: frozenset[str] | None = None

    @property
    def is_local(self) -> bool:
        return self.host == LOCAL

    @property
    def roles(self) -> dict[str, tuple[int, ...]]:
        return dict(self.gpus)


@dataclass(frozen=True)
class BotConfig:
    check_every: float = 60.0  # watchdog sweep interval
    alert_channel: str | None = None  # default alert channel
    state_db: str = "runbot.sqlite3"  # resolved against the config file's directory
    remind_every: float = 3600.0  # re-notify an open incident this often
    probe_timeout: float = 30.0  # one probe may take this long


@dataclass(frozen=True)
class Access:
    """Who may use /run. An empty set lets everyone in; a run's own lists replace these."""

    users: frozenset[str] = frozenset()
    channels: frozenset[str] = frozenset()

    def allows(self, user: str, channel: str, run: Run | None = None) -> bool:
        users = run.users if run is not None and run.users is not None else self.users
        channels = run.channels if run is not None and run.channels is not None else self.channels
        return (not users or user in users) and (not channels or channel in channels)


@dataclass(frozen=True)
class Registry:
    path: Path
    bot: BotConfig = field(default_factory=BotConfig)
    access: Access = field(default_factory=Access)
    hosts: Mapping[str, Host] = field(default_factory=dict)  # in file order
    runs: Mapping[str, Run] = field(default_factory=dict)  # in file order

    def names(self) -> list[str]:
        return list(self.runs)

    def host_of(self, run: Run) -> Host | None:
        """The run's SSH host, or None when it runs on this machine."""
        return None if run.is_local else self.hosts[run.host]

    def resolve(self, name_or_prefix: str) -> Run:
        """The run called this, else the one run whose name starts with it (case-insensitive)."""
        query = name_or_prefix.strip()
        if query in self.runs:
            return self.runs[query]
        if query:
            folded = query.casefold()
            for name, run in self.runs.items():
                if name.casefold() == folded:
                    return run
            matches = [name for name in self.runs if name.casefold().startswith(folded)]
            if len(matches) == 1:
                return self.runs[matches[0]]
            if matches:
                raise UnknownRun(query, self.names(), matches)
        raise UnknownRun(query, self.names())


# --- durations ----------------------------------------------------------------------------

_DURATION_HINT = '(use e.g. "90s", "10m", "2h")'
_UNITS = {"d": 86400.0, "h": 3600.0, "m": 60.0, "s": 1.0, "ms": 0.001}  # largest first
_DURATION_RE = re.compile(r"(?:[0-9]+(?:\.[0-9]+)?(?:ms|d|h|m|s))+")
_PART_RE = re.compile(r"([0-9]+(?:\.[0-9]+)?)(ms|d|h|m|s)")


def parse_duration(value: object, key: str, *, allow_zero: bool = False) -> float:
    """Seconds from "90s", "10m", "2h", "1d", "1h30m", "500ms", or a plain number of seconds.

    Raises ValueError `KEY: bad duration … (use e.g. …)` for anything else, including
    booleans, negative numbers and zero (unless `allow_zero`).
    """
    try:
        return _duration(value, allow_zero)
    except ValueError as exc:
        raise ValueError(f"{key}: {exc}" if key else str(exc)) from None


def format_duration(seconds: float) -> str:
    """The short spelling parse_duration reads back: 5400 -> "1h30m", 0.5 -> "500ms"."""
    millis, out = round(seconds * 1000), []
    for unit in ("d", "h", "m", "s", "ms"):
        count, millis = divmod(millis, round(_UNITS[unit] * 1000))
        if count:
            out.append(f"{count}{unit}")
    return "".join(out) or "0s"


def _duration(value: object, allow_zero: bool) -> float:
    bad = f"bad duration {_show(value)} {_DURATION_HINT}"
    if isinstance(value, bool):
        raise ValueError(bad)
    if isinstance(value, (int, float)):
        try:
            seconds = float(value)
        except OverflowError:
            raise ValueError(bad) from None
    elif isinstance(value, str):
        text = value.strip()
        negative = text.startswith("-")
        body = text[1:] if negative else text
        if re.fullmatch(r"[0-9]+(?:\.[0-9]+)?", body):
            seconds = float(body)
        elif _DURATION_RE.fullmatch(body):
            parts = _PART_RE.findall(body)
            units = [unit for _, unit in parts]
            order = list(_UNITS)
            if len(set(units)) != len(units) or units != sorted(units, key=order.index):
                raise ValueError(
                    f"bad duration {_show(value)}: each unit once, largest first {_DURATION_HINT}"
                )
            seconds = sum(float(number) * _UNITS[unit] for number, unit in parts)
        else:
            raise ValueError(bad)
        if negative:
            seconds = -seconds
    else:
        raise ValueError(bad)
    if not math.isfinite(seconds):
        raise ValueError(bad)
    if seconds < 0 or (seconds == 0 and not allow_zero):
        least = "zero or more" if allow_zero else "more than zero"
        raise ValueError(f"bad duration {_show(value)}: must be {least} {_DURATION_HINT}")
    if seconds > MAX_DURATION:
        raise ValueError(f"bad duration {_show(value)}: at most 365d")
    return seconds


# --- reading the file ---------------------------------------------------------------------


def load_registry(path: str | os.PathLike[str], env_state_db: str | None = None) -> Registry:
    """Read and validate the TOML file at `path`. Every fault is a ConfigError."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(path, "", "file not found (copy config/runs.example.toml)") from None
    except UnicodeDecodeError:
        raise ConfigError(path, "", "not UTF-8 text") from None
    except OSError as exc:
        raise ConfigError(path, "", f"cannot read it: {exc.strerror or exc}") from None
    return parse_registry(text, path, env_state_db)


def parse_registry(text: str, path: Path, env_state_db: str | None = None) -> Registry:
    """Validate TOML text read from `path` (which anchors relative paths and names the file)."""
    path = Path(path)
    try:
        data = tomllib.loads(text)
    except (ValueError, RecursionError) as exc:  # TOMLDecodeError is a ValueError
        raise _syntax_error(path, exc) from None
    return _Parser(path).registry(data, env_state_db)


_AT_RE = re.compile(r"^(.*) \(at (?:line (\d+), column (\d+)|end of document)\)$", re.S)


def _syntax_error(path: Path, exc: Exception) -> ConfigError:
    if isinstance(exc, RecursionError):
        return ConfigError(path, "", "invalid TOML: nested too deeply")
    message = str(exc)
    found = _AT_RE.match(message)
    if found is None:
        return ConfigError(path, "", f"invalid TOML: {message}")
    what, line, column = found.groups()
    where = f"line {line}, column {column}" if line else "end of file"
    return ConfigError(path, where, f"invalid TOML: {what}")


# --- validation ---------------------------------------------------------------------------

_SECTIONS = ("bot", "access", "defaults", "hosts", "runs")

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


class _Parser:
    """Walks the parsed TOML; the first fault found ends the walk with a ConfigError."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.base = os.path.abspath(path.parent)
        self.hosts: dict[str, Host] = {}

    def fail(self, key: str, fault: str) -> NoReturn:
        raise ConfigError(self.path, key, fault)

    # -- sections --

    def registry(self, data: dict[str, Any], env_state_db: str | None) -> Registry:
        self.keys(data, "", _SECTIONS, what="section")
        bot = self.bot(self.fields(data.get("bot", {}), "bot", _BOT_CHECKS), env_state_db)
        access = self.fields(data.get("access", {}), "access", _ACCESS_CHECKS)
        for name, tbl in self.table(data.get("hosts", {}), "hosts").items():
            self.hosts[name] = self.host(name, tbl)
        defaults = self.fields(data.get("defaults", {}), "defaults", _DEFAULT_CHECKS)
        runs: dict[str, Run] = {}
        folded: dict[str, str] = {}
        for name, tbl in self.table(data.get("runs", {}), "runs").items():
            key = _dotted("runs", name)
            self.name(name, key, "run")
            twin = folded.setdefault(name.casefold(), name)
            if twin != name:
                self.fail(key, f"duplicate run name: {_show(name)} and {_show(twin)} differ only in case")
            runs[name] = self.run(name, self.fields(tbl, key, _RUN_CHECKS), defaults, bot)
        return Registry(
            self.path, bot, Access(**access), MappingProxyType(self.hosts), MappingProxyType(runs)
        )

    def fields(self, value: object, key: str, checks: Mapping[str, _Check]) -> dict[str, Any]:
        """The keys set in one table, each validated by its check; unknown keys refused."""
        tbl = self.table(value, key)
        self.keys(tbl, key, tuple(checks))
        return {
            name: check(self, tbl[name], f"{key}.{name}") for name, check in checks.items() if name in tbl
        }

    def bot(self, out: dict[str, Any], env_state_db: str | None) -> BotConfig:
        if env_state_db:
            out["state_db"] = _state_db(env_state_db, os.getcwd())
        else:
            out["state_db"] = _state_db(out.get("state_db", BotConfig.state_db), self.base)
        return BotConfig(**out)

    def host(self, name: str, value: object) -> Host:
        key = _dotted("hosts", name)
        self.name(name, key, "host")
        if name.casefold() == LOCAL:
            self.fail(
                key,
                f'"{LOCAL}" is reserved for this machine (runs say host = "{LOCAL}"); pick another name',
            )
        out = self.fields(value, key, _HOST_CHECKS)
        if "address" not in out:
            self.fail(f"{key}.address", "missing (the host name or IP address to ssh to)")
        return Host(name=name, **out)

    def run(self, name: str, own: dict[str, Any], defaults: dict[str, Any], bot: BotConfig) -> Run:
        key = _dotted("runs", name)
        merged = {"alert_channel": bot.alert_channel, "container": None, **defaults, **own}
        if "host" not in merged:
            self.fail(f"{key}.host", f'missing (a [hosts.*] name or "{LOCAL}"; or set host in [defaults])')
        if "log" not in merged:
            self.fail(f"{key}.log", "missing (the path of the run's log file)")
        merged["log"] = self.log(merged["log"], f"{key}.log", merged["host"])
        return Run(name=name, **merged)

    # -- values --

    def table(self, value: object, key: str) -> dict[str, Any]:
        if not isinstance(value, dict):
            self.fail(key, f"must be a table, not {_kind(value)}")
        return value

    def keys(self, tbl: dict[str, Any], key: str, allowed: tuple[str, ...], what: str = "key") -> None:
        for name in tbl:
            if name not in allowed:
                close = difflib.get_close_matches(name, allowed, n=1, cutoff=0.7)
                home = (
                    next((section for section, checks in _HOMES.items() if name in checks), None)
                    if not key
                    else None
                )
                hint = (
                    f"it belongs under [{home}]; "
                    if home
                    else f"did you mean {_show(close[0])}? "
                    if close
                    else ""
                )
                self.fail(
                    f"{key}.{_dotted(name)}" if key else _dotted(name),
                    f"unknown {what} ({hint}allowed: {', '.join(allowed)})",
                )

    def run_host(self, value: object, key: str) -> str:
        host = self.text(value, key)
        if host != LOCAL and host not in self.hosts:
            self.fail(key, f"unknown host {_show(host)} (known: {', '.join([*self.hosts, LOCAL])})")
        return host

    def user(self, value: object, key: str) -> str:
        user = self.text(value, key)
        if not _USER_RE.fullmatch(user):
            self.fail(key, f"bad user name {_show(user)}")
        return user

    def silence_after(self, value: object, key: str) -> float | None:
        if isinstance(value, str) and value.strip() == "auto":
            return None
        return self.duration(value, key)

    def name(self, name: str, key: str, what: str) -> None:
        if not _NAME_RE.fullmatch(name):
            self.fail(key, f"bad {what} name {_show(name)} ({_NAME_RULE})")

    def text(self, value: object, key: str) -> str:
        if not isinstance(value, str):
            self.fail(key, f"must be a string, not {_kind(value)}")
        if not value.strip():
            self.fail(key, "is empty")
        if not value.isprintable():
            self.fail(key, f"{_show(value)} holds a control character (a newline?)")
        return value

    def integer(self, value: object, key: str, low: int, high: int) -> int:
        if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
            self.fail(
                key, f"bad {key.rsplit('.', 1)[-1]} {_show(value)} (a whole number from {low} to {high})"
            )
        return value

    def duration(self, value: object, key: str, *, allow_zero: bool = False) -> float:
        try:
            return _duration(value, allow_zero)
        except ValueError as exc:
            self.fail(key, str(exc))

    def container(self, value: object, key: str) -> int:
        if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= _MAX_CT:
            self.fail(
                key,
                f"bad CT id {_show(value)} (a positive whole number, e.g. 200; "
                "leave container out to run on the host itself)",
            )
        return value

    def address(self, value: object, key: str) -> str:
        address = self.text(value, key)
        if not _ADDRESS_RE.fullmatch(address):
            self.fail(
                key,
                f"bad address {_show(address)} "
                "(a host name or IP address; no spaces, user@ or shell characters)",
            )
        return address

    def jump(self, value: object, key: str) -> str:
        jump = self.text(value, key)
        found = _JUMP_RE.fullmatch(jump)
        if not found or (found["port"] and not 1 <= int(found["port"]) <= 65535):
            self.fail(key, f'bad jump host {_show(jump)} (use "host", "user@host" or "user@host:port")')
        return jump

    def file(self, value: object, key: str) -> str:
        path = os.path.expanduser(self.text(value, key))
        return os.path.normpath(os.path.join(self.base, path))

    def log(self, log: str, key: str, host: str) -> str:
        if host == LOCAL:
            return os.path.normpath(os.path.join(self.base, os.path.expanduser(log)))
        if not log.startswith("/"):
            self.fail(
                key, f"relative path {_show(log)} on host {_show(host)} (a remote log needs an absolute path)"
            )
        return log

    def channel(self, value: object, key: str) -> str:
        channel = self.text(value, key)
        if not (_CHANNEL_ID_RE.fullmatch(channel) or _CHANNEL_NAME_RE.fullmatch(channel)):
            self.fail(
                key,
                f'bad channel {_show(channel)} (a channel id like "C0123456789", or "#name" in lower case)',
            )
        return channel

    def ids(self, value: object, key: str, pattern: re.Pattern[str], what: str) -> frozenset[str]:
        if not isinstance(value, list):
            self.fail(key, f"must be a list of Slack {what} ids, not {_kind(value)}")
        for item in value:
            if not isinstance(item, str) or not pattern.fullmatch(item):
                example = "U0123ABCD" if what == "user" else "C0123456789"
                names = (
                    " (channel names cannot be checked; use the id)"
                    if isinstance(item, str) and item.startswith("#")
                    else ""
                )
                self.fail(key, f'bad {what} id {_show(item)} (Slack {what} ids look like "{example}"){names}')
        return frozenset(value)

    def gpus(self, value: object, key: str) -> tuple[tuple[str, tuple[int, ...]], ...]:
        tbl = self.table(value, key)
        seen: dict[int, str] = {}
        roles = []
        for role, indices in tbl.items():
            if not _ROLE_RE.fullmatch(role):
                self.fail(key, f'bad role name {_show(role)} (letters, digits, "_" and "-")')
            at = f"{key}.{role}"
            if not isinstance(indices, list):
                self.fail(at, f"must be a list of GPU indices like [0, 1], not {_kind(indices)}")
            if not indices:
                self.fail(at, "is empty (list the role's GPU indices, like [0, 1])")
            for index in indices:
                if isinstance(index, bool) or not isinstance(index, int) or index < 0:
                    self.fail(at, f"bad GPU index {_show(index)} (a whole number from 0)")
                if index in seen:
                    owner = seen[index]
                    self.fail(
                        at,
                        f"GPU {index} listed twice"
                        if owner == role
                        else f"GPU {index} is already in role {_show(owner)}",
                    )
                seen[index] = role
            roles.append((role, tuple(indices)))
        return tuple(roles)

    def step_pattern(self, value: object, key: str) -> str:
        pattern = self.text(value, key)
        if len(pattern) > MAX_STEP_PATTERN:
            self.fail(key, f"too long ({len(pattern)} characters; at most {MAX_STEP_PATTERN})")
        fault = _ere_fault(pattern)
        if fault:
            self.fail(key, f"{_show(pattern)}: {fault}")
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("error")  # "possible nested set" and the like
                compiled = re.compile(pattern)
        except (re.error, Warning, OverflowError, RecursionError) as exc:
            self.fail(key, f"{_show(pattern)} is not a regular expression: {getattr(exc, 'msg', exc)}")
        if compiled.search("") is not None:
            self.fail(key, f"{_show(pattern)} matches every line (even an empty one)")
        return pattern


_Check = Callable[[_Parser, Any, str], Any]  # (parser, value, key path) -> validated value

_BOT_CHECKS: dict[str, _Check] = {
    "check_every": _Parser.duration,
    "alert_channel": _Parser.channel,
    "state_db": _Parser.text,
    "remind_every": _Parser.duration,
    "probe_timeout": _Parser.duration,
}
_ACCESS_CHECKS: dict[str, _Check] = {
    "users": lambda p, v, k: p.ids(v, k, _USER_ID_RE, "user"),
    "channels": lambda p, v, k: p.ids(v, k, _ACCESS_CHANNEL_RE, "channel"),
}
_HOST_CHECKS: dict[str, _Check] = {
    "address": _Parser.address,
    "user": _Parser.user,
    "port": lambda p, v, k: p.integer(v, k, 1, 65535),
    "key": _Parser.file,
    "known_hosts": _Parser.file,
    "jump": _Parser.jump,
    "connect_timeout": _Parser.duration,
    "command_timeout": _Parser.duration,
    "keepalive": lambda p, v, k: p.duration(v, k, allow_zero=True),
    "max_channels": lambda p, v, k: p.integer(v, k, 1, 64),
}
_RUN_CHECKS: dict[str, _Check] = {
    "host": _Parser.run_host,
    "container": _Parser.container,
    "log": _Parser.text,  # resolved once the run's host is known
    "step_pattern": _Parser.step_pattern,
    "alert_channel": _Parser.channel,
    "silence_after": _Parser.silence_after,
    "loading_grace": _Parser.duration,
    "gpu_samples": lambda p, v, k: p.integer(v, k, 1, 20),
    "gpus": _Parser.gpus,
    "users": _ACCESS_CHECKS["users"],
    "channels": _ACCESS_CHECKS["channels"],
}
_DEFAULT_CHECKS = {name: check for name, check in _RUN_CHECKS.items() if name != "log"}
_HOMES = {"bot": _BOT_CHECKS, "access": _ACCESS_CHECKS, "hosts.NAME": _HOST_CHECKS, "runs.NAME": _RUN_CHECKS}


def _state_db(value: str, base: str) -> str:
    if value == ":memory:":
        return value
    return os.path.normpath(os.path.join(base, os.path.expanduser(value)))


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
            if nxt == "d":
                return r"grep -E has no \d (use [0-9])"
            if nxt == "D":
                return r"grep -E has no \D (use [^0-9])"
            if nxt.isascii() and nxt.isalnum() and nxt not in "wWsSb":
                return f"grep -E has no \\{nxt} (escape only punctuation; \\w, \\s and \\b are fine)"
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

_BARE_KEY_RE = re.compile(r"[A-Za-z0-9_-]+")


def _dotted(*parts: str) -> str:
    """A TOML key path, quoting the parts that need it: runs."v1 final".log."""
    return ".".join(p if _BARE_KEY_RE.fullmatch(p) else _show(p) for p in parts)


def _show(value: object) -> str:
    """A value as TOML would spell it, short and on one line."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        text = value if len(value) <= 60 else value[:57] + "..."
        return _one_line(json.dumps(text, ensure_ascii=False))
    if isinstance(value, int):
        return repr(value) if abs(value) < 10**18 else "a huge number"
    if isinstance(value, float):
        return repr(value) if math.isfinite(value) else str(value)
    return _kind(value)


def _kind(value: object) -> str:
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int):
        return "an integer"
    if isinstance(value, float):
        return "a number"
    if isinstance(value, str):
        return f"the string {_show(value)}"
    if isinstance(value, list):
        return "a list"
    if isinstance(value, dict):
        return "a table"
    return "a date/time"


def _one_line(text: str) -> str:
    """Escape anything that a terminal or str.splitlines() would break a line at."""
    return "".join(c if c.isprintable() else f"\\u{ord(c):04x}" for c in text)
