"""The environment for a CLI command without pydantic: config.settings' validated answer, kept between calls.

`Settings` (config/settings.py) stays the one definition of what runbot reads from the environment and
how it is validated. Importing pydantic-settings costs more than the rest of a `runbot status`, so a
command that needs no Slack secret (all but `serve` and `doctor`) reuses the answer Settings gave the
last time for the very same inputs, and asks Settings again whenever anything differs. What makes an
answer the same one, and why nothing secret is kept: docs/decisions.md, "A quick CLI".
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import logging
import os
import stat
import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING

from bot import __version__

if TYPE_CHECKING:
    from config.settings import Settings

DEFAULT_CONFIG = "config/runs.toml"
DOT_ENV = ".env"  # Settings' env_file, read from the working directory
DEFINITION = Path(__file__).with_name("settings.py")  # Settings itself: a new field or rule is a new answer
# What else decides Settings' answer: the libraries that validate it (a reinstall rewrites their files).
VALIDATORS = ("pydantic", "pydantic_core", "pydantic_settings", "dotenv")
FORMAT = 1  # the cache file's layout


def config_path(cli_value: str | None, settings: Settings | Remembered) -> Path:
    """The TOML file to read: `--config`, else `RUNBOT_CONFIG`, else `config/runs.toml`."""
    chosen = cli_value or settings.runbot_config or DEFAULT_CONFIG
    return Path(chosen).expanduser()


def log_level(named: str | None, default: int, *, verbose: bool = False) -> int:
    """The logging level: --verbose (debug), else RUNBOT_LOG_LEVEL (validated: debug, info, …), else `default`."""
    if verbose:
        return logging.DEBUG
    return logging.getLevelName(named.upper()) if named else default


@dataclass(frozen=True)
class Remembered:
    """Settings' non-secret values as it validated them for these inputs, read as Settings' attributes. A secret
    is never kept, so asking for one (a Slack token) is an AttributeError: the commands that need one load
    Settings itself."""

    values: Mapping[str, object]

    def __getattr__(self, name: str) -> object:  # only for names that are not attributes of the class
        if name.startswith("_") or name == "values":  # not a setting (copy and pickle look for these)
            raise AttributeError(name)
        try:
            return self.values[name]
        except KeyError:
            raise AttributeError(f"{name} is not kept between calls (secrets never are): load(secrets=True)") from None

    def log_level(self, default: int, *, verbose: bool = False) -> int:
        return log_level(self.values["runbot_log_level"], default, verbose=verbose)  # type: ignore[arg-type]


def load(*, secrets: bool) -> Settings | Remembered:
    """The environment's settings (a bad value is a one-line ConfigError, from Settings). Without `secrets`,
    the last answer for the same inputs when there is one: no pydantic import."""
    if not secrets and (kept := _read(cache_file())) is not None:
        return kept
    from config.settings import load_settings  # noqa: PLC0415 - pydantic only when nothing kept answers

    before = _key(_field_names())
    settings = load_settings()
    if before is not None and before == _key(_field_names()):  # the inputs did not change while it read them
        _write(cache_file(), before, settings)
    return settings


def cache_file() -> Path | None:
    """$XDG_CACHE_HOME/runbot/settings.json (else ~/.cache/…); None when there is no home to keep it in."""
    base = os.environ.get("XDG_CACHE_HOME", "")
    try:
        root = Path(base) if os.path.isabs(base) else Path.home() / ".cache"
    except RuntimeError:  # no HOME, no passwd entry
        return None
    return root / "runbot" / "settings.json"


def _field_names() -> list[str]:
    from config.settings import Settings  # noqa: PLC0415 - only on the way to asking Settings anyway

    return list(Settings.model_fields)


def _key(fields: Iterable[str]) -> str | None:
    """A digest of everything Settings' answer depends on; None when one of them cannot be read plainly."""
    names = {f.lower() for f in fields}
    parts = [str(FORMAT), __version__, sys.version, ",".join(sorted(names))]
    try:
        parts.append(DEFINITION.read_bytes())
        for name in VALIDATORS:
            spec = importlib.util.find_spec(name)
            if spec is None or spec.origin is None:
                return None
            st = os.stat(spec.origin)
            parts.append(f"{name}={spec.origin}:{st.st_mtime_ns}:{st.st_size}")
        parts.append(_dot_env())
    except (OSError, ValueError, ImportError):
        return None
    # In the environment's own order: pydantic-settings matches names in any case, the last of two wins.
    parts += [f"{k}={v}" for k, v in os.environ.items() if k.lower() in names]
    digest = hashlib.sha256()
    for part in parts:
        data = part.encode("utf-8", "surrogateescape") if isinstance(part, str) else part
        digest.update(len(data).to_bytes(8, "big") + data)  # length-prefixed: no two inputs run together
    return digest.hexdigest()


def _dot_env() -> bytes:
    """The .env file's bytes, or a marker that there is none; anything but a plain file (a FIFO, a folder) is
    left to Settings (ValueError: nothing kept)."""
    try:
        st = os.stat(DOT_ENV)
    except FileNotFoundError:
        return b"\0no .env"
    if not stat.S_ISREG(st.st_mode):
        raise ValueError(f"{DOT_ENV} is not a plain file")
    return b"\0.env\0" + Path(DOT_ENV).read_bytes()


def _read(path: Path | None) -> Remembered | None:
    if path is None:
        return None
    try:
        kept = json.loads(path.read_bytes())
        if kept["format"] != FORMAT or kept["key"] != _key(kept["fields"]):
            return None
        return Remembered(MappingProxyType(dict(kept["values"])))
    except (OSError, ValueError, KeyError, TypeError, AttributeError):  # none yet, unreadable, or not runbot's
        return None


def _write(path: Path | None, key: str, settings: Settings) -> None:
    """Keep the answer for next time, whole or not at all (a temporary file renamed over it); a cache that
    cannot be written is only slower."""
    if path is None:
        return
    import tempfile  # noqa: PLC0415 - only when writing

    kept = {"format": FORMAT, "key": key, "fields": list(type(settings).model_fields), "values": settings.kept()}
    try:
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".settings-", suffix=".tmp")  # mode 0600
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as out:
                json.dump(kept, out)
            os.replace(tmp, path)
        except BaseException:
            os.unlink(tmp)
            raise
    except OSError:
        pass
