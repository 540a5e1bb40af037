"""One list of commands (issue 22): what /run registers is what the manifest's usage_hint, the README and
docs/slack.md name, and every read-only Slack command has its CLI twin."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import pytest

import bot.service.app  # noqa: F401 - registers every /run subcommand
from bot.cli import _parser
from handlers.commands import SUBCOMMANDS

ROOT = Path(__file__).resolve().parent.parent
REGISTERED = set(SUBCOMMANDS)
# What changes something (a watch, a mute) or only lists the others stays in Slack.
SLACK_ONLY = {"watch", "mute", "unmute", "help"}


def _slack_table(text: str, header: str) -> set[str]:
    """The /run NAMEs in the first column of the Markdown table under the row `header`."""
    rows = text.split(header + "\n", 1)[1].split("\n\n", 1)[0].splitlines()
    return {name for row in rows for name in re.findall(r"`/run (?:or `/run )?([a-z-]+)", row.split(" | ")[0])}


def test_the_manifest_usage_hint_names_every_command() -> None:
    hint = re.search(r'usage_hint: "([^"]*)"', (ROOT / "slack-app-manifest.yml").read_text())[1]
    assert set(hint.split(" ")[0].split("|")) == REGISTERED


@pytest.mark.parametrize("doc, header", [("README.md", "| in Slack | what it does |"), ("docs/slack.md", "| command | answer |")])
def test_each_doc_tables_every_command(doc: str, header: str) -> None:
    assert _slack_table((ROOT / doc).read_text(), header) == REGISTERED


def test_every_read_only_slack_command_has_a_cli_twin() -> None:
    sub = next(a for a in _parser()._actions if isinstance(a, argparse._SubParsersAction))
    assert REGISTERED - SLACK_ONLY - set(sub.choices) == set()
