"""The functional core stays free of IO: importing it loads no SSH, Slack, scheduler, SQLite or process library."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.standins import REPO

# Every module of the pure packages, and the probe's script builder (string work only).
PURE = sorted({".".join(p.relative_to(REPO).with_suffix("").parts) for pkg in ("core", "render")
               for p in (REPO / "bot" / pkg).rglob("*.py") if p.stem != "__init__"} | {"bot.probe.script", "bot.probe.host_script"})
IO = {"asyncssh", "slack_bolt", "slack_sdk", "apscheduler", "sqlite3", "aiosqlite", "subprocess", "asyncio", "aiohttp",
      "prometheus_client"}


def test_the_pure_packages_are_all_checked():
    assert {"bot.core.diagnose", "bot.core.ledger", "bot.render.slack", "bot.core.stages.headline"} <= set(PURE)
    assert len(PURE) > 25


def test_the_pure_core_imports_no_io_library():
    code = ("import sys, importlib; before = set(sys.modules); "
            f"[importlib.import_module(m) for m in {PURE!r}]; "
            "print(' '.join(sorted({m.split('.')[0] for m in set(sys.modules) - before})))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=REPO)
    loaded = set(out.stdout.split())
    assert not loaded & IO, loaded & IO
    assert loaded - set(sys.stdlib_module_names) <= {"bot"}, loaded


def test_the_core_and_renderers_never_reach_into_the_edges():
    """The layers point inwards: core and render import only core and render (and the standard library)."""
    code = ("import sys, importlib; "
            f"[importlib.import_module(m) for m in {[m for m in PURE if not m.startswith('bot.probe.')]!r}]; "
            "print(' '.join(sorted(m for m in sys.modules if m.startswith('bot.'))))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=REPO)
    outside = {m for m in out.stdout.split() if not m.startswith(("bot.core", "bot.render"))}
    assert outside == set(), outside


def test_the_tests_read_nothing_beside_the_clone():
    """A plain `git clone` has no ../shared: every fixture a test reads lives under tests/fixtures."""
    here = Path(__file__).resolve().parent
    outside = [f"{p.name}:{n}" for p in sorted(here.rglob("*.py")) if p.name != Path(__file__).name
               for n, line in enumerate(p.read_text().splitlines(), 1)
               if "../" + "shared" in line or "parents[2]" in line or "/work/shared" in line]
    assert outside == [], outside
