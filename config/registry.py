"""The registry: one TOML file -> validated hosts, runs, access rules and bot settings."""

from __future__ import annotations

import difflib
import os
import re
import tomllib
import urllib.parse
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import MappingProxyType
from typing import Any

# Durations, MAX_STEP_PATTERN and ConfigError live in their own modules; callers still import
# them from here (see __all__).
from config.durations import MAX_DURATION, format_duration, parse_duration
from config.state_where import is_server
from config.validate import (MAX_STEP_PATTERN, ConfigError, ConfigFaults, Validator, dotted, faults_of, one_line,
                             parse_jump, show)

__all__ = [
    "LOCAL", "DEFAULT_SILENCE_AFTER", "DEFAULT_LOADING_GRACE", "DEFAULT_GPU_SAMPLES", "MAX_DURATION",
    "MAX_STEP_PATTERN", "ConfigError", "ConfigFaults", "faults_of", "UnknownRun", "Host", "jump_host", "Run", "BotConfig", "Access", "Registry",
    "parse_duration", "format_duration", "load_registry", "parse_registry", "config_warnings",
]

LOCAL = "local"  # the host name meaning "this machine"

DEFAULT_SILENCE_AFTER = 600.0  # "10m"
DEFAULT_LOADING_GRACE = 2700.0  # "45m"
DEFAULT_GPU_SAMPLES = 5
MAX_URL = 2000
_LISTEN_HOST = re.compile(r"[A-Za-z0-9._-]{1,253}|[0-9A-Fa-f:.%]{2,64}")  # a name, an IPv4 or an IPv6 address


class UnknownRun(LookupError):
    """No run matches a name, or a prefix matches several. `str()` says which runs exist."""

    def __init__(self, query: str, known: list[str], ambiguous: list[str] | None = None) -> None:
        super().__init__(query, known, ambiguous or [])
        self.query = query
        self.known = list(known)
        self.ambiguous = list(ambiguous or [])

    def __str__(self) -> str:
        if self.ambiguous:
            return one_line(
                f"{show(self.query)} matches several runs: {', '.join(self.ambiguous)} (say which)"
            )
        known = f"known: {', '.join(self.known)}" if self.known else "no runs are configured"
        if not self.query:
            return f"which run? ({known})"
        return one_line(f"unknown run {show(self.query)} ({known})")


# --- the values ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Host:
    """A machine reached over SSH (a Proxmox node, or any Linux box): what the SSH transport connects with."""

    name: str
    address: str
    user: str = "root"
    port: int = 22
    key: str | None = None  # private key file; None: ssh-agent, then the usual key files
    known_hosts: str | None = None  # None: the usual known_hosts files
    jump: str | None = None  # another [hosts.*] name, else "[user@]host[:port]" (see jump_host)
    connect_timeout: float = 10.0
    command_timeout: float = 60.0
    keepalive: float = 30.0  # seconds between keepalives; 0 = off
    max_channels: int = 8  # concurrent SSH sessions on one connection (1..64)
    # May runbot probe the host itself, outside every CT (`discover`, `host`, who holds each GPU)? Off unless
    # asked: it runs `pct` and `nvidia-smi` as the SSH user on the node, which an admin should choose to allow.
    host_view: bool = False

    @property
    def where(self) -> str:
        return f"{self.name} ({self.user}@{self.address}:{self.port})"


def jump_host(host: Host, hosts: Mapping[str, Host]) -> Host | None:
    """The host whose connection carries `host`'s: the one rule for `jump`, used by the config and the transport.

    A jump that names another [hosts.*] entry is that host, its own jump and all; anything else is
    "[user@]host[:port]", reached with `host`'s key, known_hosts and timeouts. A host cannot jump through
    itself and jumps cannot loop: the configuration refuses both (see _Parser.jumps).
    """
    if not host.jump:
        return None
    if host.jump in hosts:
        return hosts[host.jump]
    user, address, port = parse_jump(host.jump)
    return replace(host, name=f"jump host {address}", address=address, port=port, user=user or host.user, jump=None)


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
    # Alerts on the numbers (from the run's own history): the rate below slow_below of its recent
    # baseline for slow_for; a loss spike (off unless asked: noisy on some real curves).
    slow_below: float = 0.6
    slow_for: float = 600.0
    loss_spike: bool = False
    summary: bool = True  # post an end-of-run summary when it finishes or crashes

    @property
    def is_local(self) -> bool:
        return self.host == LOCAL

    @property
    def where(self) -> str:
        """Where the run lives, as answers show it: "local · /x.log", "pve1 CT 200 · /workspace/train.log"."""
        place = self.host + (f" CT {self.container}" if self.container is not None else "")
        return f"{place} · {self.log}"

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
    max_mute: float = 7 * 86400.0  # /run mute RUN DURATION: the longest a run may be silenced
    flap_window: float = 600.0  # state changes counted over this long to tell a flapping run
    flap_changes: int = 6  # this many in the window: one "flapping" message instead of each change
    history_full: float = 86400.0  # every point is kept this long
    history_every: float = 600.0  # then one per this much
    history_keep: float = 30 * 86400.0  # and nothing older
    heartbeat_url: str | None = None  # a dead-man's switch (healthchecks.io's convention) pinged each sweep
    metrics_listen: tuple[str, int] | None = None  # (host, port) serving GET /metrics; None: no metrics


@dataclass(frozen=True)
class Access:
    """Who may use /run. An empty set lets everyone in; a run's own lists replace these."""

    users: frozenset[str] = frozenset()
    channels: frozenset[str] = frozenset()
    admins: frozenset[str] = frozenset()  # may also run /run doctor (it shows the whole install)

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

    def resolve(self, name_or_prefix: str, among: Iterable[str] | None = None) -> Run:
        """The run called this, else the one run whose name starts with it (case-insensitive).

        `among` limits the search to those run names (the runs a Slack user may see): a run outside
        it is unknown, and no error names it, so a name cannot be probed for.
        """
        names = list(self.runs) if among is None else [n for n in among if n in self.runs]
        query = name_or_prefix.strip()
        if query in names:
            return self.runs[query]
        if query:
            folded = query.casefold()
            for name in names:
                if name.casefold() == folded:
                    return self.runs[name]
            matches = [name for name in names if name.casefold().startswith(folded)]
            if len(matches) == 1:
                return self.runs[matches[0]]
            if matches:
                raise UnknownRun(query, names, matches)
        raise UnknownRun(query, names)


def config_warnings(registry: Registry) -> list[str]:
    """What a valid configuration still gets wrong for its user: nothing to watch, alerts with nowhere to go."""
    if not registry.runs:
        return ["no runs configured: runbot has nothing to probe or watch (add a [runs.NAME] table; "
                "`runbot init` writes a commented example)"]
    silent = [r.name for r in registry.runs.values() if r.alert_channel is None]
    if silent:
        return [f"no alert channel for {', '.join(silent)}: the watchdog tracks their incidents but posts "
                "nowhere (set [bot] alert_channel, or alert_channel on the run)"]
    return []


# --- reading the file ---------------------------------------------------------------------


def load_registry(path: str | os.PathLike[str], env_state_db: str | None = None) -> Registry:
    """Read and validate the TOML file at `path`. Every fault is a ConfigError."""
    # The only IO in the configuration: everything below it is pure validation.
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(path, "", f"file not found (`runbot init {path}` writes a commented example there)") from None
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
    if what.startswith("Unescaped '\\'"):  # step_pattern = "step=\d+": TOML's "…" reads \d as an escape
        what += " (in \"…\" a backslash starts an escape: write a pattern in single quotes, 'step=\\d+', or double it)"
    return ConfigError(path, where, f"invalid TOML: {what}")


# --- the walk -----------------------------------------------------------------------------

_SECTIONS = ("bot", "access", "defaults", "hosts", "runs")


class _Parser(Validator):
    """Walks the parsed TOML, gathering every fault: each key's value is checked on its own, so one bad
    value costs only that key (a run missing its host is still checked for the rest). The walk ends by
    raising them all as one ConfigFaults."""

    def __init__(self, path: Path) -> None:
        super().__init__(path)
        self.hosts: dict[str, Host] = {}
        self.host_names: set[str] = set()  # hosts named in the file, valid or not (runs may point at them)
        self.faults: list[ConfigError] = []
        self.bad: set[str] = set()  # key paths whose value was refused: not "missing" as well

    def note(self, fault: ConfigError) -> None:
        self.faults.append(fault)
        self.bad.add(fault.key)

    @contextmanager
    def each(self) -> Iterator[None]:
        """One unit of the walk (a value, a host, a run): its fault is noted and the walk goes on."""
        try:
            yield
        except ConfigFaults as faults:  # a value with several faults of its own (gpus: one per role)
            for fault in faults.faults:
                self.note(fault)
        except ConfigError as fault:
            self.note(fault)

    # -- sections --

    def registry(self, data: dict[str, Any], env_state_db: str | None) -> Registry:
        self.keys(data, "", _SECTIONS, what="section")
        bot = self.bot(self.fields(data.get("bot", {}), "bot", _BOT_CHECKS), env_state_db)
        access = self.fields(data.get("access", {}), "access", _ACCESS_CHECKS)
        hosts = self.section(data, "hosts")
        self.host_names = set(hosts)
        for name, tbl in hosts.items():
            with self.each():
                if (host := self.host(name, tbl)) is not None:
                    self.hosts[name] = host
        self.jumps()
        defaults = self.fields(data.get("defaults", {}), "defaults", _DEFAULT_CHECKS)
        runs: dict[str, Run] = {}
        folded: dict[str, str] = {}
        for name, tbl in self.section(data, "runs").items():
            with self.each():
                key = dotted("runs", name)
                self.name(name, key, "run")
                twin = folded.setdefault(name.casefold(), name)
                if twin != name:
                    self.fail(key, f"duplicate run name: {show(name)} and {show(twin)} differ only in case")
                run = self.run(name, self.fields(tbl, key, _RUN_CHECKS), defaults, bot)
                if run is not None:
                    runs[name] = run
        if self.faults:
            raise ConfigFaults(self.faults)
        return Registry(
            self.path, bot, Access(**access), MappingProxyType(self.hosts), MappingProxyType(runs)
        )

    def section(self, data: dict[str, Any], name: str) -> dict[str, Any]:
        """A [hosts] or [runs] table; one that is not a table is a fault and holds nothing."""
        with self.each():
            return self.table(data.get(name, {}), name)
        return {}

    def fields(self, value: object, key: str, checks: Mapping[str, _Check]) -> dict[str, Any]:
        """The keys set in one table, each validated by its check (the good ones kept); unknown keys refused."""
        try:
            tbl = self.table(value, key)
        except ConfigError as fault:
            self.note(fault)
            return {}
        out: dict[str, Any] = {}
        for name, value in tbl.items():  # in file order, so the faults are too
            if name not in checks:
                self.unknown(name, key, tuple(checks))
                continue
            with self.each():
                out[name] = checks[name](self, value, f"{key}.{name}")
        return out

    def bot(self, out: dict[str, Any], env_state_db: str | None) -> BotConfig:
        if env_state_db:
            out["state_db"] = _state_db(env_state_db, os.getcwd())
        else:
            out["state_db"] = _state_db(out.get("state_db", BotConfig.state_db), self.base)
        bot = BotConfig(**out)
        if not bot.history_every <= bot.history_full <= bot.history_keep:
            self.note(ConfigError(self.path, "bot.history_full", f"history_every ({format_duration(bot.history_every)}) <= history_full "
                      f"({format_duration(bot.history_full)}) <= history_keep ({format_duration(bot.history_keep)}) must hold"))
        return bot

    def host(self, name: str, value: object) -> Host | None:
        """The host, or None when its address was refused (that fault is already noted)."""
        key = dotted("hosts", name)
        self.name(name, key, "host")
        if name.casefold() == LOCAL:
            self.fail(
                key,
                f'"{LOCAL}" is reserved for this machine (runs say host = "{LOCAL}"); pick another name',
            )
        out = self.fields(value, key, _HOST_CHECKS)
        if "address" not in out and not {key, f"{key}.address"} & self.bad:
            self.fail(f"{key}.address", "missing (the host name or IP address to ssh to)")
        return Host(name=name, **out) if "address" in out else None

    def jumps(self) -> None:
        """Refuse a host that jumps through itself, or a chain of jumps that comes back round (jump_host's rule)."""
        for name, host in self.hosts.items():
            seen, hop = [name], host
            while hop.jump and hop.jump in self.host_names:
                if hop.jump in seen:
                    loop = " -> ".join([*seen, hop.jump])
                    what = "jumps through itself" if hop.jump == name and len(seen) == 1 else f"jump hosts loop ({loop})"
                    self.note(ConfigError(self.path, f"{dotted('hosts', name)}.jump",
                                          f"{what}: a jump names the host to connect through first"))
                    break
                seen.append(hop.jump)
                if (hop := self.hosts.get(hop.jump)) is None:  # refused itself: that fault is already noted
                    break

    def run(self, name: str, own: dict[str, Any], defaults: dict[str, Any], bot: BotConfig) -> Run | None:
        """The run, or None when a key it cannot do without was refused (that fault is already noted)."""
        key = dotted("runs", name)
        merged = {"alert_channel": bot.alert_channel, "container": None, **defaults, **own}
        refused = {k for k in ("host", "log") if {key, "defaults", f"{key}.{k}", f"defaults.{k}"} & self.bad}
        if "host" not in merged and "host" not in refused:
            self.fail(f"{key}.host", f'missing (a [hosts.*] name or "{LOCAL}"; or set host in [defaults])')
        if "log" not in merged and "log" not in refused:
            self.fail(f"{key}.log", "missing (the path of the run's log file)")
        log = merged.get("log")
        if refused == {"host"} and isinstance(log, str) and not log.startswith("/"):
            # The host was refused (unknown, say: never "local"), and a relative log is a fault on any other.
            self.note(ConfigError(self.path, f"{key}.log", f'relative path {show(log)} (a log on a host other than "{LOCAL}" '
                                  "needs an absolute path)"))
        if refused or "host" not in merged or "log" not in merged:
            return None
        merged["log"] = self.log(merged["log"], f"{key}.log", merged["host"], merged["container"])
        return Run(name=name, **merged)

    # -- values that need the walk --

    def keys(self, tbl: dict[str, Any], key: str, allowed: tuple[str, ...], what: str = "key") -> None:
        for name in tbl:
            if name not in allowed:
                self.unknown(name, key, allowed, what)

    def unknown(self, name: str, key: str, allowed: tuple[str, ...], what: str = "key") -> None:
        """Note a key the table may not hold, with the key it was probably meant to be."""
        close = difflib.get_close_matches(name, allowed, n=1, cutoff=0.7)
        home = next((section for section, checks in _HOMES.items() if name in checks), None) if not key else None
        hint = f"it belongs under [{home}]; " if home else f"did you mean {show(close[0])}? " if close else ""
        self.note(ConfigError(self.path, f"{key}.{dotted(name)}" if key else dotted(name),
                              f"unknown {what} ({hint}allowed: {', '.join(allowed)})"))

    def run_host(self, value: object, key: str) -> str:
        host = self.text(value, key)
        if host != LOCAL and host not in self.host_names:
            self.fail(key, f"unknown host {show(host)} (known: {', '.join([*self.host_names, LOCAL])})")
        return host

    def log(self, log: str, key: str, host: str, container: int | None) -> str:
        if host == LOCAL and container is None:
            return os.path.normpath(os.path.join(self.base, os.path.expanduser(log)))
        if not log.startswith("/"):
            where = f"in CT {container} (a log inside a container" if host == LOCAL else f"on host {show(host)} (a remote log"
            self.fail(key, f"relative path {show(log)} {where} needs an absolute path)")
        return log

    def url(self, value: object, key: str) -> str:
        """An http(s) URL a ping may be appended to (`/start`, `/fail`). Faults never echo it: a ping URL
        carries its check's key, and whoever holds it can ping (or pause) the check."""
        url = self.text(value, key).strip()
        if len(url) > MAX_URL or any(c.isspace() for c in url):
            self.fail(key, f"must be one URL of at most {MAX_URL} characters, without spaces")
        try:
            parts = urllib.parse.urlsplit(url)
            parts.port  # noqa: B018 - raises ValueError on a port that is not a number from 0 to 65535
        except ValueError:
            self.fail(key, "is not a URL (a bad port, or brackets that do not close?)")
        if parts.scheme not in ("https", "http"):
            self.fail(key, f"must start https:// (or http://), not {show(parts.scheme + ':') if parts.scheme else 'without one'}")
        if not parts.hostname:
            self.fail(key, "has no host (https://hc-ping.com/<uuid>)")
        if parts.username is not None or parts.password is not None:
            self.fail(key, "holds a user or password (user:pass@): runbot sends none; the ping URL is its own key")
        if parts.query or parts.fragment or url.endswith(("?", "#")):
            self.fail(key, "has a ?query or a #fragment: runbot appends /start and /fail to the URL's path")
        return url.rstrip("/")

    def listen(self, value: object, key: str) -> tuple[str, int]:
        """Where to listen: 9464 or "9464" (this machine only, 127.0.0.1), "HOST:PORT", "[::1]:PORT"."""
        text = str(value) if isinstance(value, int) and not isinstance(value, bool) else self.text(value, key).strip()
        host, sep, port = text.rpartition(":")
        host = host.strip("[]") if sep else "127.0.0.1"
        if not port.isdigit() or not 1 <= int(port) <= 65535 or not _LISTEN_HOST.fullmatch(host):
            self.fail(key, f'bad listen address {show(text)} (a port, 9464; or "HOST:PORT": "127.0.0.1:9464", '
                           '"0.0.0.0:9464" for every interface, "[::1]:9464")')
        return host, int(port)

    def silence_after(self, value: object, key: str) -> float | None:
        if isinstance(value, str) and value.strip() == "auto":
            return None
        return self.duration(value, key)

    # Durations are checked here rather than in config.validate, which config.durations
    # itself imports (for `show`).
    def duration(self, value: object, key: str, *, allow_zero: bool = False) -> float:
        try:
            return parse_duration(value, "", allow_zero=allow_zero)  # "": the key goes in the ConfigError
        except ValueError as exc:
            self.fail(key, str(exc))


# --- the keys each table may hold (docs/configuration.md is the user-facing reference) ------

_Check = Callable[[_Parser, Any, str], Any]  # (parser, value, key path) -> validated value

_BOT_CHECKS: dict[str, _Check] = {
    "check_every": _Parser.duration,
    "alert_channel": _Parser.channel,
    "state_db": _Parser.text,
    "remind_every": _Parser.duration,
    "probe_timeout": _Parser.duration,
    "max_mute": _Parser.duration,
    "flap_window": _Parser.duration,
    "flap_changes": lambda p, v, k: p.integer(v, k, 2, 1000),
    "history_full": _Parser.duration,
    "history_every": _Parser.duration,
    "history_keep": _Parser.duration,
    "heartbeat_url": _Parser.url,
    "metrics_listen": _Parser.listen,
}
_ACCESS_CHECKS: dict[str, _Check] = {
    "users": _Parser.user_ids,
    "channels": _Parser.channel_ids,
    "admins": _Parser.user_ids,
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
    "host_view": _Parser.boolean,
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
    "slow_below": _Parser.fraction,
    "slow_for": _Parser.duration,
    "loss_spike": _Parser.boolean,
    "summary": _Parser.boolean,
}
_DEFAULT_CHECKS = {name: check for name, check in _RUN_CHECKS.items() if name != "log"}
_HOMES = {"bot": _BOT_CHECKS, "access": _ACCESS_CHECKS, "hosts.NAME": _HOST_CHECKS, "runs.NAME": _RUN_CHECKS}


def _state_db(value: str, base: str) -> str:
    """A file path, resolved against the config's folder, or a PostgreSQL URL, kept as it is (README: Two replicas)."""
    if value == ":memory:" or is_server(value):
        return value
    return os.path.normpath(os.path.join(base, os.path.expanduser(value)))
