"""The commented example configuration that `runbot init` writes (config/runs.example.toml, shipped in the package)."""

from __future__ import annotations

from importlib import resources

NAME = "runs.example.toml"


def text() -> str:
    """The example, read from the installed package: a pip-installed runbot has no checkout to copy it from."""
    return resources.files("config").joinpath(NAME).read_text(encoding="utf-8")
