"""Charts of a run's history: the picture itself, `runbot plot`, and `/run plot` end to end against the Slack stand-in."""

from __future__ import annotations

import asyncio
import io
import math
import os
import re
import struct
import subprocess
import sys
import threading
import time
import types
from pathlib import Path

import pytest

from bot.core.history import Point, RoleLoad
from bot.core.ledger import Incident, Ledger, PutIncident
from bot.core.verdict import Phase
from bot.render import chart as render_chart
from bot.render.chart import chart
from bot.service.charts import ChartQueue
from bot.service.store import Store
from handlers import plot as plot_handler
from handlers.commands import Usage
from tests.slack_stub import SlackStub
from tests.standins import REPO, immutable, mutable
from tests.test_slack_app import Bot

NOW = 1_800_000_000.0
H = 3600.0
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def history(now: float = NOW, hours: float = 6, every: float = 30, restart_at: float | None = None) -> list[Point]:
    """A run's points: loss falling, a steady rate, two GPU roles on every 4th point; a restart if asked."""
    out, segment, step = [], 0, 0
    n = int(hours * H / every)
    for i in range(n + 1):
        t = now - hours * H + i * every
        if restart_at is not None and segment == 0 and t >= restart_at:
            segment, step = 1, 0
        step += 1
        gpus = (RoleLoad("target", 0.9, 120.0), RoleLoad("drafter", 0.4 + 0.1 * (i % 3), 40.0)) if i % 4 == 0 else ()
        out.append(Point(t, Phase.TRAINING, 0, step, 10_000, 2 + 6 * math.exp(-step / 150), 14_000 + (i % 7) * 50,
                         "tok/s", segment, gpus))
    return out


def size(png: bytes) -> tuple[int, int]:
    """Width and height from the PNG's IHDR chunk (after checking it is a PNG at all)."""
    assert png[:8] == PNG_MAGIC
    assert png[12:16] == b"IHDR"
    return struct.unpack(">II", png[16:24])


def pixels(png: bytes):
    """The image as rows of 0..255 RGB."""
    import matplotlib.image  # noqa: PLC0415
    import numpy  # noqa: PLC0415

    data = matplotlib.image.imread(io.BytesIO(png), format="png")
    return numpy.rint(data[..., :3] * 255).astype(int)


def colours(png: bytes) -> int:
    import numpy  # noqa: PLC0415

    rgb = pixels(png)
    return len(numpy.unique(rgb.reshape(-1, 3), axis=0))


def red(rgb):
    """Pixels of an incident's mark (INCIDENT, antialiased onto white): not the orange of a line."""
    r, g, b = rgb[..., 0], rgb[..., 1], rgb[..., 2]
    return (r > 180) & (g < 140) & (abs(g - b) < 30)


def grey(rgb):
    """Pixels of a restart's dashed line (RESTART, antialiased): neutral and mid-dark."""
    return (rgb.max(axis=2) - rgb.min(axis=2) < 12) & (rgb[..., 0] > 60) & (rgb[..., 0] < 150)


def line_columns(png: bytes, kind, least: int = 120) -> list[int]:
    """x of the columns with at least `least` pixels of a kind: where a vertical line is drawn."""
    import numpy  # noqa: PLC0415

    return [int(x) for x in numpy.flatnonzero(kind(pixels(png)).sum(axis=0) >= least)]


def a_readable_png(png: bytes) -> None:
    width, height = size(png)
    assert abs(width - 900) <= 20 and abs(height - 500) <= 20, (width, height)
    assert colours(png) > 1  # not blank


# -- the picture ------------------------------------------------------------------------------


@pytest.mark.parametrize("metric", render_chart.METRICS)
def test_each_metric_draws_a_phone_sized_picture(metric):
    png = chart("dflash", history(), metric=metric, now=NOW, window=6 * H)
    a_readable_png(png)
    assert colours(png) > 20  # lines, text, antialiasing: a chart, not a flat message
    assert not line_columns(png, red) and not line_columns(png, grey)  # no restart, no incident: no marks


@pytest.mark.parametrize("metric", render_chart.METRICS)
def test_restarts_are_dashed_lines_and_incidents_red_ones(metric):
    restart, incident = NOW - 2 * H, NOW - 4 * H
    png = chart("dflash", history(restart_at=restart), metric=metric, now=NOW, window=6 * H, incidents=[incident])
    a_readable_png(png)
    reds, greys = line_columns(png, red), line_columns(png, grey)
    assert reds and greys
    # Both inside the plotting area, the incident (−4h) left of the restart (−2h), a third of the width apart.
    assert max(reds) < min(greys)
    assert 200 < min(greys) - max(reds) < 400


def test_a_day_of_gpu_readings_is_averaged_into_slices_restart_kept():
    points = history(hours=24, every=30, restart_at=NOW - 6 * H)  # 720 readings per role
    png = chart("dflash", points, metric="gpus", now=NOW, window=24 * H, incidents=[NOW - 12 * H])
    a_readable_png(png)
    assert line_columns(png, red) and line_columns(png, grey)
    busy = [(p.t, p.gpus[1].busy * 100, p.segment) for p in points if p.gpus]
    sliced = render_chart._binned(busy, NOW - 24 * H, 24 * H / render_chart.BUSY_BINS)
    assert render_chart.BUSY_BINS <= len(sliced) <= render_chart.BUSY_BINS + 2  # the restart splits one slice
    assert {s for _, _, s in sliced} == {0, 1} and all(40 <= y <= 60 for _, y, _ in sliced)


def test_marks_outside_the_window_are_left_out():
    png = chart("dflash", history(), metric="loss", now=NOW, window=6 * H, incidents=[NOW - 30 * H, NOW + 5 * H])
    assert not line_columns(png, red)


@pytest.mark.parametrize("metric", render_chart.METRICS)
def test_nan_inf_none_and_absurd_values_are_dropped_not_drawn(metric):
    points = history()
    bad = [None, math.nan, math.inf, -math.inf, 1e300, -1e300]
    for k, value in enumerate(bad):
        i = 10 + 30 * k
        p = points[i]
        points[i] = Point(p.t, p.phase, p.level, p.step, p.total, value, value, p.unit, p.segment,
                          (RoleLoad("target", value, value), RoleLoad("drafter", 7.0, -3.0)))
    points.append(Point(math.nan, Phase.TRAINING, 0, 1, None, 1.0))  # a time that is no time
    png = chart("dflash", points, metric=metric, now=NOW, window=6 * H, incidents=[math.nan, math.inf])
    a_readable_png(png)
    assert not line_columns(png, red)


@pytest.mark.parametrize("metric", render_chart.METRICS)
def test_nothing_but_bad_values_says_so_in_a_picture(metric):
    points = [Point(NOW - k * 60, Phase.TRAINING, 0, k, None, math.nan, math.inf, "tok/s", 0,
                    (RoleLoad("target", math.nan, None),)) for k in range(20)]
    a_readable_png(chart("dflash", points, metric=metric, now=NOW, window=6 * H))


@pytest.mark.parametrize("metric", render_chart.METRICS)
def test_no_points_at_all_is_still_a_picture(metric):
    png = chart("gpt5", [], metric=metric, now=NOW, window=6 * H, incidents=[NOW - H])
    a_readable_png(png)
    empty = chart("gpt5", [], metric=metric, now=NOW, window=6 * H)
    assert png == empty  # a mark with nothing to mark it on is not drawn


def test_the_empty_picture_and_its_words_differ_by_run():
    assert chart("a", [], metric="loss", now=NOW, window=H) != chart("a-much-longer-name", [], metric="loss", now=NOW,
                                                                     window=H)


def test_names_are_shown_as_written_never_as_math():
    points = [Point(p.t, p.phase, p.level, p.step, p.total, p.loss, p.rate, "$tok/s", p.segment,
                    (RoleLoad("$role_1$", 0.5, 1.0), RoleLoad("_hidden", 0.5, 1.0)))
              for p in history(hours=1)]
    for metric in render_chart.METRICS:
        a_readable_png(chart("r$un_$1 \\frac", points, metric=metric, now=NOW, window=H))


def test_a_single_point_and_sparse_points_are_visible():
    one = [Point(NOW - 600, Phase.TRAINING, 0, 5, None, 2.5, 900.0, "it/s")]
    for metric in ("loss", "rate"):
        a_readable_png(chart("dflash", one, metric=metric, now=NOW, window=H))


def test_rates_in_another_unit_are_not_mixed_in():
    points = history(hours=1)
    older = [Point(p.t - 2 * H, p.phase, p.level, p.step, p.total, p.loss, 3.2, "it/s") for p in points]
    a_readable_png(chart("dflash", older + points, metric="rate", now=NOW, window=4 * H))


def test_a_metric_that_does_not_exist_is_refused():
    with pytest.raises(ValueError, match="loss, rate, gpus"):
        chart("dflash", history(), metric="lr", now=NOW, window=H)


@pytest.mark.parametrize("window, labels", [
    (6 * H, ["−6h", "−5h", "−4h", "−3h", "−2h", "−1h", "now"]),
    (24 * H, ["−24h", "−20h", "−16h", "−12h", "−8h", "−4h", "now"]),
    (30 * 60, ["−30m", "−25m", "−20m", "−15m", "−10m", "−5m", "now"]),
    (90 * 60, ["−90m", "−75m", "−60m", "−45m", "−30m", "−15m", "now"]),
    (7 * 86400, ["−6d", "−4d", "−2d", "now"]),
    (45, ["−40s", "−30s", "−20s", "−10s", "now"]),
])
def test_the_time_axis_is_read_back_from_now(window, labels):
    from matplotlib.figure import Figure  # noqa: PLC0415

    ax = Figure().add_subplot()
    render_chart._time_axis(ax, window)
    assert [t.get_text() for t in ax.get_xticklabels()] == labels
    assert ax.get_xlim() == (-window, 0)


def test_importing_the_renderer_does_not_load_matplotlib():
    code = "import sys, bot.render.chart, bot.cli, bot.service.app; print('matplotlib' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=REPO)
    assert out.stdout.strip() == "False"


# -- runbot plot ------------------------------------------------------------------------------


def runbot(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RUNBOT_", "SLACK_"))}
    return subprocess.run([sys.executable, "-m", "bot", *args], capture_output=True, text=True, timeout=120,
                          env={**env, "PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO)}, cwd=cwd)


@pytest.fixture
def config(tmp_path: Path) -> Path:
    path = tmp_path / "runs.toml"
    path.write_text('[bot]\nstate_db = "state.sqlite3"\n'
                    f'[runs.dflash]\nhost = "local"\nlog = "{tmp_path / "dflash.log"}"\n'
                    f'[runs.llama-7b]\nhost = "local"\nlog = "{tmp_path / "llama.log"}"\n')
    return path


def write_state(path: Path, points: list[Point], *, run: str = "dflash", incidents: list[float] = ()) -> None:
    store = Store(path)
    try:
        store.apply([PutIncident(Incident(run, k + 1, "C0ALERTS", f"{t:.6f}", t)) for k, t in enumerate(incidents)],
                    [(run, p) for p in points])
    finally:
        store.close()


def test_plot_writes_the_chart_from_the_state_file(config, tmp_path):
    now = time.time()
    points = history(now=now - 60, hours=3, every=60, restart_at=now - H)
    write_state(tmp_path / "state.sqlite3", points + [Point(now - 20 * H, Phase.TRAINING, 0, 1, None, 9.0)],
                incidents=[now - 2 * H])
    write_state(tmp_path / "state.sqlite3", history(now=now, hours=1), run="llama-7b")  # another run's points
    out = runbot("--config", str(config), "plot", "dfl", "-o", "out.png", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert out.stdout == f"wrote out.png ({len(points)} points, since 6h ago)\n"  # not the 20 h old one, not llama's
    png = (tmp_path / "out.png").read_bytes()
    a_readable_png(png)
    assert line_columns(png, red)  # the incident, read from the same file

    out = runbot("--config", str(config), "plot", "dflash", "--metric", "gpus", "--since", "30m", "-o",
                 str(tmp_path / "gpus.png"), cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith(f"wrote {tmp_path / 'gpus.png'} (29 points, since 30m ago)")  # one a minute, the newest a minute old
    a_readable_png((tmp_path / "gpus.png").read_bytes())


def test_plot_with_no_points_still_writes_a_picture(config, tmp_path):
    write_state(tmp_path / "state.sqlite3", [])
    out = runbot("--config", str(config), "plot", "llama", "--metric", "rate", "-o", "none.png", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("wrote none.png (0 points, since 6h ago)")
    a_readable_png((tmp_path / "none.png").read_bytes())


@pytest.mark.parametrize("args, words", [
    (("plot", "dflash", "-o", "x.png"), "no state file at "),  # no state file yet: said, not created
    (("plot", "dflash", "--since", "soon", "-o", "x.png"), "--since: bad duration"),
    (("plot", "dflash", "--since", "31d", "-o", "x.png"), "--since: at most 30d"),
    (("plot", "dflash", "--metric", "lr", "-o", "x.png"), "invalid choice"),
    (("plot", "dflash"), "required: -o"),
    (("plot", "gpt5", "-o", "x.png"), 'unknown run "gpt5"'),
])
def test_plot_mistakes_exit_2_in_one_line(config, tmp_path, args, words):
    out = runbot("--config", str(config), *args, cwd=tmp_path)
    assert out.returncode == 2
    assert words in out.stderr
    assert not (tmp_path / "x.png").exists() and not (tmp_path / "state.sqlite3").exists()
    if words != "invalid choice" and words != "required: -o":  # argparse prints its usage first
        assert len(out.stderr.strip().splitlines()) == 1, out.stderr


def test_plot_cannot_write_the_file_exit_2(config, tmp_path):
    write_state(tmp_path / "state.sqlite3", history(now=time.time(), hours=1))
    out = runbot("--config", str(config), "plot", "dflash", "-o", str(tmp_path / "no" / "such" / "dir.png"), cwd=tmp_path)
    assert out.returncode == 2
    assert out.stderr.startswith("runbot: -o ") and len(out.stderr.strip().splitlines()) == 1


def test_plot_on_a_file_that_is_not_a_state_file_exit_2(config, tmp_path):
    (tmp_path / "state.sqlite3").write_text("not a database at all " * 100)
    out = runbot("--config", str(config), "plot", "dflash", "-o", "x.png", cwd=tmp_path)
    assert out.returncode == 2 and len(out.stderr.strip().splitlines()) == 1, out.stderr
    assert "state.sqlite3" in out.stderr


def test_plot_reads_a_state_file_it_cannot_write(config, tmp_path):
    # A chart is a read: it used to exit 2 on a read-only file ("attempt to write a readonly database").
    state = tmp_path / "state.sqlite3"
    write_state(state, history(now=time.time(), hours=1, every=600))
    if not immutable(state):
        pytest.skip("chattr +i is not possible here (as root, permissions alone stop no write)")
    try:
        out = runbot("--config", str(config), "plot", "dflash", "-o", "ro.png", cwd=tmp_path)
    finally:
        mutable(state)
    assert out.returncode == 0, out.stderr
    assert out.stdout == "wrote ro.png (7 points, since 6h ago)\n"
    a_readable_png((tmp_path / "ro.png").read_bytes())


# -- /run plot ----------------------------------------------------------------------------------


class FakeHistory:
    """What /run plot asks of bot.service.history.History: the run's points over a window."""

    def __init__(self, points: dict[str, list[Point]]) -> None:
        self._points = points
        self.asked: list[tuple[str, float, float | None]] = []

    async def points(self, run: str, since: float, until: float | None = None) -> list[Point]:
        self.asked.append((run, since, until))
        return [p for p in self._points.get(run, []) if p.t >= since and (until is None or p.t <= until)]


@pytest.fixture(scope="module")
def stub():
    with SlackStub() as s:
        yield s


def bot_with_memory(tmp_path, stub, points: dict[str, list[Point]], incidents: list[Incident], **kw) -> Bot:
    """The real Bolt app whose runs' memory holds `points`, and whose watchdog ledger holds `incidents`."""
    bot = Bot(tmp_path, stub, **kw)
    bot.history = bot.services.history = FakeHistory(points)
    bot.services.store = types.SimpleNamespace(ledger=Ledger(incidents={(i.run, i.seq): i for i in incidents}))
    return bot


@pytest.fixture
def make_bot(tmp_path, stub):
    stub.reset()

    def make(**kw) -> Bot:
        now = time.time()
        return bot_with_memory(tmp_path, stub, {"dflash": history(now=now, hours=6, restart_at=now - H)},
                               [Incident("dflash", 1, "C0ALERTS", "1.000100", now - 2 * H)], **kw)

    return make


def upload_flow(stub: SlackStub) -> list[str]:
    """The upload's steps and the answer, in the order the stand-in saw them."""
    return [("upload" if kind == "upload" else "answer" if kind == "response" else name)
            for _, kind, name, _ in stub.events
            if kind in ("upload", "response") or name.startswith("files.")]


async def test_plot_uploads_the_chart_to_the_channel_and_tells_the_user(make_bot, stub):
    async with make_bot() as bot:
        name, status, ack = await bot.command("plot dfl rate 3h", channel="C0PLOTS")
        assert status == 200
        answer = await bot.answer(name, timeout=30)
    assert upload_flow(stub) == ["files.getUploadURLExternal", "upload", "files.completeUploadExternal", "answer"]
    (asked,) = stub.posts("files.getUploadURLExternal")
    assert asked["filename"] == "dflash-rate.png" and int(asked["length"]) == len(stub.files[0]["content"])
    (shared,) = stub.files
    assert shared["channel_id"] == "C0PLOTS"
    assert shared["title"] == "dflash · rate · last 3 h"
    assert shared["initial_comment"] == "dflash: rate, last 3 h"
    png = shared["content"]
    assert png == stub.uploads[shared["id"]]
    a_readable_png(png)
    assert line_columns(png, red) and line_columns(png, grey)  # the incident, the restart
    (run, since, _), = bot.history.asked
    assert run == "dflash" and abs(time.time() - 3 * H - since) < 60
    assert answer["response_type"] == "ephemeral"
    assert re.match(r":chart_with_upwards_trend: posted dflash's rate chart \(last 3 h, 36[01] points\) in this channel$",
                    answer["text"]), answer["text"]
    assert bot.probes == 0  # drawn from memory: nothing probed the run


async def test_plot_defaults_to_the_loss_of_the_last_6_hours(make_bot, stub):
    async with make_bot() as bot:
        answer = await bot.ask("plot dflash here")
    assert "posted dflash's loss chart (last 6 h" in answer["text"]
    assert stub.posts("files.getUploadURLExternal")[0]["filename"] == "dflash-loss.png"
    assert stub.files[0]["channel_id"] == "C0TEAM"


async def test_plot_of_a_run_with_no_history_still_posts_a_picture(make_bot, stub):
    async with make_bot() as bot:
        answer = await bot.ask("plot llama gpus 24h")
    assert "posted llama-7b's GPUs chart (last 24 h, 0 points)" in answer["text"]
    a_readable_png(stub.files[0]["content"])


@pytest.mark.parametrize("text, why", [
    ("plot dflash lr", "“lr” is neither a metric (loss, rate, gpus) nor a duration"),
    ("plot dflash 6 hours", "a duration needs its unit: 6h, 6m"),
    ("plot dflash six", "“six” is neither a metric"),
    ("plot dflash 31d", "at most 30d back"),
    ("plot dflash 1x", "bad duration"),
    ("plot dflash loss rate", "one metric at a time"),
    ("plot dflash 6h 2h", "one duration at a time"),
    ("plot dflash 0s", "must be more than zero"),
    ("plot", ""),
    ("plot dflash loss 6h extra", ""),
])
async def test_plot_usage_mistakes_answer_the_usage_and_upload_nothing(make_bot, stub, text, why):
    async with make_bot() as bot:
        answer = await bot.ask(text)
        assert bot.history.asked == []
    first = answer["text"].splitlines()[0]
    assert first.startswith("usage: /run plot RUN [loss|rate|gpus] [DURATION] — a chart of the run's history")
    assert why in first
    assert answer["response_type"] == "ephemeral"
    assert not [m for m, _ in stub.calls if m.startswith("files.")]


async def test_plot_of_an_unknown_run_lists_the_known_ones(make_bot, stub):
    async with make_bot() as bot:
        answer = await bot.ask("plot gpt5")
    assert answer["text"] == 'unknown run "gpt5" (known: dflash, llama-7b)'
    assert not stub.files


async def test_plot_without_history_says_so_in_one_line(make_bot, stub):
    async with make_bot() as bot:
        bot.services.history = None
        answer = await bot.ask("plot dflash")
    assert answer["text"].startswith("no history is kept here") and "\n" not in answer["text"]
    assert answer["response_type"] == "ephemeral" and not stub.files


@pytest.mark.parametrize("fault, says", [
    ({"status": 200, "method": "files.completeUploadExternal", "error": "not_in_channel"},
     "cannot post the chart here (not_in_channel); invite the bot to this channel"),
    ({"status": 200, "method": "files.getUploadURLExternal", "error": "missing_scope"},
     "cannot post the chart here (missing_scope); the Slack app lacks the files:write scope"),
    ({"status": 500, "method": "upload"}, "cannot post the chart here: SlackRequestError: Failed to upload a file (status: 500"),
    ({"status": 0, "method": "files.completeUploadExternal"}, "the upload broke off, the chart may or may not be in"),
])
async def test_a_failed_upload_is_one_line_never_a_traceback(make_bot, stub, fault, says):
    async with make_bot() as bot:
        stub.fail(**fault)
        answer = await bot.ask("plot dflash")
    assert answer["text"].startswith(says), answer["text"]
    assert "\n" not in answer["text"] and "Traceback" not in answer["text"]
    assert answer["response_type"] == "ephemeral"


async def test_plot_is_in_the_help(make_bot):
    async with make_bot() as bot:
        help_ = await bot.ask("help")
    assert "/run plot RUN [loss|rate|gpus] [DURATION] — a chart of the run's history, posted here" in help_["text"]
    assert help_["text"].splitlines()[-1].startswith("/run help")


@pytest.mark.parametrize("words, parsed", [
    ([], ("loss", 6 * H)),
    (["gpus"], ("gpus", 6 * H)),
    (["RATE"], ("rate", 6 * H)),
    (["24h"], ("loss", 24 * H)),
    (["rate", "90m"], ("rate", 90 * 60)),
    (["2d", "gpus"], ("gpus", 2 * 86400)),
    (["30d"], ("loss", 30 * 86400)),
])
def test_the_words_after_the_run(words, parsed):
    assert plot_handler.parse_args(words) == parsed


@pytest.mark.parametrize("words", [["lr"], ["-1h"], ["0"], ["6"], ["31d"], ["loss", "loss"], ["1h", "1h"], ["inf"], ["1e9h"]])
def test_words_that_are_not_a_metric_or_a_duration(words):
    with pytest.raises(Usage):
        plot_handler.parse_args(words)


# -- a storm of charts ----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def named_stub():
    """The Slack stand-in reached by name, as Slack is: every call resolves "localhost" first, in the
    event loop's default executor (aiohttp's resolver), which is what 50 charts once starved."""
    with SlackStub(host="localhost") as s:
        yield s


def last_word(stub: SlackStub, name: str):
    """The answer to `name` once it is more than its place in the queue (None until then)."""
    said = stub.responses_to(name)
    return said[-1] if said and not said[-1]["text"].startswith(":hourglass") else None


async def test_fifty_charts_at_once_leave_help_answered_promptly(tmp_path, named_stub):
    # 50 `/run plot` at once: one `/run help` answer was lost, the charts took 67.5 s (issue 19.8).
    named_stub.reset()
    now = time.time()
    async with bot_with_memory(tmp_path, named_stub, {"dflash": history(now=now, hours=6)}, []) as bot:
        await bot.ask("help")  # the first request pays for auth.test
        started = time.monotonic()
        plots = await asyncio.gather(*(bot.command("plot dflash") for _ in range(50)))
        assert all(status == 200 for _, status, _ in plots)
        asked = time.monotonic()
        help_ = await bot.ask("help")
        help_s = time.monotonic() - asked
        answers = [await named_stub.until(lambda n=name: last_word(named_stub, n), timeout=240) for name, _, _ in plots]
        storm_s = time.monotonic() - started
    assert "/run plot RUN" in help_["text"]
    assert help_s < 2.0, f"help took {help_s:.1f} s behind 50 charts"
    assert len(named_stub.files) == 50
    assert all(a["text"].startswith(":chart_with_upwards_trend: posted dflash's loss chart") for a in answers)
    # Each asker whose chart had to wait heard its place first: 1, 2, … 49 ahead, once each.
    places = sorted(int(m["text"].split()[1]) for name, _, _ in plots for m in named_stub.responses_to(name)
                    if m["text"].startswith(":hourglass"))
    assert places == list(range(1, 50))
    print(f"help {help_s:.2f} s during the storm, 50 charts in {storm_s:.1f} s")


async def test_past_the_queue_limit_a_chart_is_refused_in_one_line(make_bot, stub, monkeypatch):
    gate = threading.Event()
    drawn = render_chart.chart

    def held(*args, **kwargs):  # each chart waits for the gate: the queue fills up deterministically
        gate.wait(30)
        return drawn(*args, **kwargs)

    monkeypatch.setattr(plot_handler.render_chart, "chart", held)
    async with make_bot() as bot:
        bot.services.charts = ChartQueue(limit=2)
        await bot.ask("help")
        plots = [name for name, status, _ in await asyncio.gather(*(bot.command("plot dflash") for _ in range(5)))]
        # Three refusals and the second in line's place in the queue, while the first is still being drawn.
        await stub.until(lambda: sum(bool(stub.responses_to(n)) for n in plots) == 4)
        assert bot.services.charts.queued == 2
        gate.set()
        answers = [await stub.until(lambda n=name: last_word(stub, n), timeout=60) for name in plots]
    texts = sorted(a["text"] for a in answers)
    assert texts[-3:] == ["too many charts queued, try again in a minute"] * 3
    assert all(t.startswith(":chart_with_upwards_trend: posted") for t in texts[:2])
    assert len(stub.files) == 2
    # The second in line heard its place while the first was drawn; the first was drawn at once.
    notes = [m["text"] for n in plots for m in stub.responses_to(n) if m["text"].startswith(":hourglass")]
    assert notes == [":hourglass_flowing_sand: 1 chart ahead of yours; it will be posted here when drawn"]
