"""runbot in the team's monitoring stack: /metrics scraped over real HTTP and read with Prometheus' own text
parser, the dead-man's switch pinging a checker on 127.0.0.1, the Grafana dashboard, and their configuration."""

from __future__ import annotations

import asyncio
import json
import re
import signal
import threading
import time
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from dataclasses import replace
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from bot.core.verdict import Level, Phase, Verdict
from bot.probe.targets import Targets
from bot.service import monitoring
from bot.service.chat import SlackChat
from bot.service.heartbeat import Heartbeat
from bot.service.metrics import PHASES, Metrics
from bot.service.observe import ObservedChat, Observers
from bot.service.state_file import StateFile
from bot.service.watchdog import Watchdog
from config.registry import ConfigError, parse_registry
from tests.slack_stub import BOT_TOKEN, SlackStub
from tests.standins import REPO, fake_nvidia_smi, writer_holding
from tests.test_machine import rich
from tests.test_serve import free_port, serve_env, start_serve

TOKEN = "hf_abcdefghijklmnopqrstuvwxyz0123456789"
SMI = "0, 70000, 143771, 99\n1, 30000, 143771, 95\n"
DASHBOARD = REPO / "docs" / "grafana-dashboard.json"


class Checker:
    """A dead-man's switch on 127.0.0.1 (healthchecks.io's ping API): records each ping; `hang` holds answers."""

    def __init__(self) -> None:
        self.pings: list[tuple[str, str, str, dict]] = []  # (method, path, body, headers)
        self.hang = 0.0
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def _ping(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0)).decode()
                outer.pings.append((self.command, self.path, body, dict(self.headers)))
                time.sleep(outer.hang)
                try:
                    self.send_response(200)
                    self.send_header("Content-Length", "2")
                    self.end_headers()
                    self.wfile.write(b"OK")
                except (BrokenPipeError, ConnectionResetError):  # runbot stopped waiting (its ping timeout)
                    pass

            do_GET = do_POST = _ping

            def log_message(self, *args) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_port}/ping/5e1ec7ed-uuid"

    def kinds(self) -> list[str]:
        return [path.rsplit("5e1ec7ed-uuid", 1)[1] or "success" for _, path, _, _ in self.pings]

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def checker():
    c = Checker()
    yield c
    c.close()


@pytest.fixture(scope="module")
def stub():
    with SlackStub() as s:
        yield s


def scrape(port: int) -> dict[str, list]:
    """GET /metrics, read by Prometheus' own parser: {family name: its samples}."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as answer:
        assert answer.headers["Content-Type"].startswith("text/plain; version=0.0.4")
        text = answer.read().decode()
    return {f.name: f.samples for f in text_string_to_metric_families(text)}


def value(families: dict, name: str, **labels: str) -> float | None:
    family = re.sub(r"_(total|bucket|count|sum|created)$", "", name)
    for sample in families.get(family, ()):
        if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
            return sample.value
    return None


def write_config(tmp: Path, checker: Checker, metrics_port: int, *, extra: str = "") -> Path:
    (tmp / "train.log").write_text(f"step=41 loss=2.25 tok/s=14100\nstep=42 loss=2.21 tok/s=14200 {TOKEN}\n")
    fake_nvidia_smi(tmp / "bin", [SMI])
    config = tmp / "runs.toml"
    config.write_text(
        f'[bot]\ncheck_every = "1s"\nalert_channel = "C0ALERTS"\nheartbeat_url = "{checker.url}"\n'
        f'metrics_listen = "127.0.0.1:{metrics_port}"\n'
        f'[runs.dflash]\nhost = "local"\nlog = "{tmp / "train.log"}"\ngpu_samples = 1\nsilence_after = "1h"\n'
        "[runs.dflash.gpus]\ntarget = [0]\ndrafter = [1]\n"
        f'[runs.eagle]\nhost = "local"\nlog = "{tmp / "missing.log"}"\n{extra}')
    return config


# -- runbot serve, a real process: /metrics and the heartbeat -------------------------------------------------


def test_serve_exports_metrics_and_pings_the_heartbeat(tmp_path, stub, checker):
    stub.reset()
    metrics_port = free_port()
    write_config(tmp_path, checker, metrics_port)
    with writer_holding(tmp_path / "train.log"):
        proc = start_serve(tmp_path, serve_env(tmp_path, stub, free_port()))
        try:
            stub.wait_for(lambda: checker.kinds().count("success") >= 2 or proc.poll() is not None, timeout=60)
            assert proc.poll() is None, proc.communicate()
            stub.wait_for(lambda: stub.posts("chat.postMessage"), timeout=30)  # eagle's "log not found" alert
            # The sweeps after it see the outbox empty again; eagle (not ok) is looked at every sweep, dflash (steady,
            # silence_after 1h) rests between looks (bot.core.cadence): 4 probes take a sweep more than 2 x 2.
            families = stub.wait_for(lambda: (f := scrape(metrics_port)) and value(f, "runbot_outbox_messages") == 0
                                     and (value(f, "runbot_probes_total", outcome="ok") or 0) >= 4 and f, timeout=30)
            with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/healthz", timeout=10) as answer:
                health = json.loads(answer.read())  # what the container's HEALTHCHECK asks (docs/deploy/Dockerfile)
        finally:
            proc.send_signal(signal.SIGTERM)
            _, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    assert health == {"ok": True, "role": "leader", "state": "sqlite"}  # a lone bot on SQLite leads
    # Each run's verdict in numbers.
    assert value(families, "runbot_run_level", run="dflash") == int(Level.OK)
    assert value(families, "runbot_run_level", run="eagle") == int(Level.CRIT)
    assert value(families, "runbot_run_phase", run="dflash", phase="training") == 1.0
    assert sum(value(families, "runbot_run_phase", run="dflash", phase=p) for p in PHASES) == 1.0
    assert value(families, "runbot_run_phase", run="eagle", phase="no_log") == 1.0
    assert (value(families, "runbot_run_step", run="dflash"), value(families, "runbot_run_rate", run="dflash"),
            value(families, "runbot_run_loss", run="dflash")) == (42, 14200, 2.21)
    assert value(families, "runbot_run_step", run="eagle") is None  # not known: no series, never a made-up 0
    assert value(families, "runbot_run_progress_age_seconds", run="dflash") >= 0
    assert value(families, "runbot_run_gpu_busy_ratio", run="dflash", role="target") == 1.0
    assert value(families, "runbot_run_gpu_busy_ratio", run="dflash", role="drafter") == 1.0
    assert value(families, "runbot_run_gpu_memory_bytes", run="dflash", role="target") == pytest.approx(70000 * 2**20, rel=1e-3)
    # runbot's own health.
    assert value(families, "runbot_sweep_duration_seconds_count") >= 2
    assert value(families, "runbot_probes_total", outcome="ok") >= 4
    assert value(families, "runbot_sweeps_total", outcome="ok") >= 2
    assert value(families, "runbot_slack_calls_total", method="post", outcome="ok") >= 1
    assert time.time() - value(families, "runbot_last_successful_sweep_timestamp_seconds") < 30
    assert value(families, "runbot_info", version=__import__("bot").__version__) == 1
    # Bounded labels: runs and roles from the config, and fixed words.
    labels = {(k, v) for samples in families.values() for s in samples for k, v in s.labels.items()}
    assert {v for k, v in labels if k == "run"} == {"dflash", "eagle"}
    assert {v for k, v in labels if k == "role"} == {"target", "drafter", "GPUs"}
    assert {v for k, v in labels if k == "phase"} == set(PHASES)
    assert TOKEN not in json.dumps(sorted(labels))
    # The heartbeat: /start before each sweep, success after, never a secret in what it sends.
    kinds = checker.kinds()
    assert kinds[:2] == ["/start", "success"] and "/fail" not in kinds
    assert all(method == "POST" for method, *_ in checker.pings)
    sent = json.dumps([(path, body, headers) for _, path, body, headers in checker.pings])
    assert TOKEN not in sent and BOT_TOKEN not in sent and "Authorization" not in sent
    assert re.fullmatch(r"swept 2 runs in \d+\.\d\d s", checker.pings[1][2])


def test_serve_says_in_one_line_when_the_metrics_port_is_taken(tmp_path, stub, checker):
    stub.reset()
    with __import__("socket").socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        write_config(tmp_path, checker, port)
        proc = start_serve(tmp_path, serve_env(tmp_path, stub, free_port()))
        _, err = proc.communicate(timeout=60)
    assert proc.returncode == 1
    assert f"runbot: cannot listen on 127.0.0.1:{port} for /metrics ([bot] metrics_listen)" in err
    assert "Traceback" not in err


# -- the heartbeat, in process: fail, never blocking, bounded --------------------------------------------------


def watchdog(tmp_path: Path, checker: Checker, stub: SlackStub, runs: str) -> tuple[Watchdog, Heartbeat, Metrics]:
    config = tmp_path / "runs.toml"
    config.write_text(f'[bot]\nalert_channel = "C0ALERTS"\nheartbeat_url = "{checker.url}"\n{runs}')
    registry = parse_registry(config.read_text(), config)
    heartbeat, metrics = Heartbeat(registry.bot.heartbeat_url), Metrics(registry.runs.values())
    observer = Observers([heartbeat, metrics])
    from slack_sdk.web.async_client import AsyncWebClient

    chat = ObservedChat(SlackChat(AsyncWebClient(token=BOT_TOKEN, base_url=stub.api_url + "/")), observer)
    wd = Watchdog(registry, Targets(registry), StateFile.open(tmp_path / "state.sqlite3"), chat, observer=observer)
    return wd, heartbeat, metrics


UNREACHABLE = ('[hosts.gone]\naddress = "127.0.0.1"\nport = 1\nconnect_timeout = "2s"\n'
               '[runs.far]\nhost = "gone"\nlog = "/x.log"\n[runs.farther]\nhost = "gone"\nlog = "/y.log"\n')


async def test_a_sweep_that_reaches_no_host_pings_fail_with_a_short_reason(tmp_path, checker, stub):
    stub.reset()
    wd, heartbeat, metrics = watchdog(tmp_path, checker, stub, UNREACHABLE)
    heartbeat.start()
    try:
        await wd.sweep()
        await stub.until(lambda: len(checker.pings) >= 2)
    finally:
        await heartbeat.stop()
        await wd.targets.close()
        wd.state_file.close()
    assert checker.kinds() == ["/start", "/fail"]
    assert checker.pings[1][2] == "no run reached: 2 unreachable (unreachable 2)"  # counts and kinds, no host, no text
    assert metrics.sweeps.labels("unreached")._value.get() == 1 and metrics.probes.labels("unreachable")._value.get() == 2


async def test_a_sweep_that_fails_pings_fail(tmp_path, checker, stub, monkeypatch):
    wd, heartbeat, _ = watchdog(tmp_path, checker, stub, "")
    heartbeat.start()

    async def broken(wait=None):
        wd.observer.sweep_started()
        raise RuntimeError("disk on fire")

    monkeypatch.setattr(wd, "sweep", broken)
    try:
        await wd._scheduled_sweep()
        await stub.until(lambda: len(checker.pings) >= 2)
    finally:
        await heartbeat.stop()
        wd.state_file.close()
    assert checker.kinds() == ["/start", "/fail"] and checker.pings[1][2] == "the sweep failed: RuntimeError"


async def test_a_hanging_checker_never_slows_a_sweep_and_the_queue_stays_bounded(tmp_path, checker):
    checker.hang = 5.0
    heartbeat = Heartbeat(checker.url, timeout=0.5, queue_size=4)
    heartbeat.start()
    try:
        started = time.perf_counter()
        for _ in range(1000):
            heartbeat.sweep_started()
            heartbeat.judged("r", Verdict("r", Phase.TRAINING, Level.OK, "x"))
            heartbeat.sweep_finished(type("Report", (), {"still_running": (), "probed": 1, "seconds": 0.1})())
        spent = time.perf_counter() - started
        assert spent < 0.5 and heartbeat.queue.qsize() <= 4 and heartbeat.dropped >= 1990
        await asyncio.sleep(1.2)  # the sender's ping timed out (0.5 s) and it went on to the next
        assert len(checker.pings) >= 2
    finally:
        await heartbeat.stop(timeout=0.1)


async def test_an_observer_that_raises_costs_the_sweep_nothing(tmp_path, checker, stub):
    class Broken:
        def __getattr__(self, name):
            def fail(*args):
                raise ValueError(name)
            return fail

    wd, heartbeat, metrics = watchdog(tmp_path, checker, stub, '[runs.r]\nhost = "local"\nlog = "r.log"\n')
    wd.observer = Observers([Broken(), metrics])
    (tmp_path / "r.log").write_text("step=1 loss=2.0\n")
    try:
        report = await wd.sweep()
    finally:
        await wd.targets.close()
        wd.state_file.close()
    assert report.probed == 1 and metrics.probes.labels("ok")._value.get() == 1


async def test_slack_calls_are_counted_by_outcome(tmp_path, checker, stub):
    stub.reset()
    wd, _, metrics = watchdog(tmp_path, checker, stub, "")
    stub.fail(status=200, error="channel_not_found", method="chat.postMessage")
    stub.rate_limit(times=1, retry_after=60, method="chat.update")
    for call in (wd.chat.post("C0ALERTS", "a", None), wd.chat.post("C0ALERTS", "b", None), wd.chat.update("C0ALERTS", "1.1", "c", None)):
        try:
            await call
        except Exception:  # noqa: BLE001 - the outcome is what is counted
            pass
    wd.state_file.close()
    count = {(m, o): metrics.slack.labels(m, o)._value.get() for m, o in
             [("post", "refused"), ("post", "ok"), ("update", "rate_limited")]}
    assert count == {("post", "refused"): 1, ("post", "ok"): 1, ("update", "rate_limited"): 1}


# -- the Grafana dashboard ----------------------------------------------------------------------------------------


def exported() -> set[str]:
    """Every series name the metrics export, histogram and counter suffixes included."""
    config = '[runs.dflash]\nhost = "local"\nlog = "/r.log"\n[runs.dflash.gpus]\ntarget = [0, 1]\ndrafter = [2, 3]\n'
    metrics = Metrics(parse_registry(config, Path("/x/runs.toml")).runs.values())
    metrics.judged("dflash", replace(rich(), step=replace(rich().step, loss=2.0)))  # a finite loss: every series has a sample
    metrics.sweep_finished(type("Report", (), {"still_running": (), "probed": 1, "seconds": 0.1, "outbox": 0})())
    return {s.name for f in text_string_to_metric_families(metrics.exposition().decode()) for s in f.samples}


def test_the_grafana_dashboard_loads_and_names_only_metrics_that_exist():
    board = json.loads(DASHBOARD.read_text())
    assert board["title"] and board["panels"] and board["schemaVersion"] >= 30
    exprs = [t["expr"] for p in board["panels"] for t in p.get("targets", ())]
    exprs += [v["query"]["query"] if isinstance(v.get("query"), dict) else v.get("query", "")
              for v in board.get("templating", {}).get("list", ()) if v.get("type") == "query"]
    named = {m for e in exprs for m in re.findall(r"\brunbot_[a-z_]+", e)}
    assert named and named <= exported(), named - exported()
    used = {re.sub(r"_(total|bucket|count|sum)$", "", m) for m in named}
    families = {re.sub(r"_(total|bucket|count|sum|created)$", "", m) for m in exported()}
    assert families - used == {"runbot_info"}, families - used  # each one shown (but the version)


# -- the configuration ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("line, fault", [
    ('heartbeat_url = "ftp://hc-ping.com/x"', 'must start https:// (or http://), not "ftp:"'),
    ('heartbeat_url = "hc-ping.com/x"', "must start https:// (or http://)"),
    ('heartbeat_url = "https:///x"', "has no host"),
    ('heartbeat_url = "https://u:secret@hc-ping.com/x"', "holds a user or password"),
    ('heartbeat_url = "https://hc-ping.com/x?rid=1"', "has a ?query or a #fragment"),
    ('heartbeat_url = "https://hc-ping.com:99999/x"', "is not a URL"),
    ('heartbeat_url = "https://hc-ping.com/a b"', "without spaces"),
    ("heartbeat_url = 3", "must be a string"),
    ('metrics_listen = "0"', "bad listen address"),
    ('metrics_listen = "host name:9464"', "bad listen address"),
    ('metrics_listen = "127.0.0.1:"', "bad listen address"),
    ("metrics_listen = true", "must be a string"),
])
def test_bad_monitoring_keys_are_refused_with_the_fix(line, fault, tmp_path):
    with pytest.raises(ConfigError) as caught:
        parse_registry(f"[bot]\n{line}\n", tmp_path / "runs.toml")
    assert caught.value.key.startswith("bot.") and fault in caught.value.fault
    assert "secret" not in str(caught.value)  # a ping URL is its check's key: faults never echo it


@pytest.mark.parametrize("line, field, value", [
    ('heartbeat_url = "https://hc-ping.com/5e1ec7ed/"', "heartbeat_url", "https://hc-ping.com/5e1ec7ed"),
    ('heartbeat_url = "http://127.0.0.1:8000/ping/x"', "heartbeat_url", "http://127.0.0.1:8000/ping/x"),
    ("metrics_listen = 9464", "metrics_listen", ("127.0.0.1", 9464)),  # this machine only, unless told
    ('metrics_listen = "0.0.0.0:9464"', "metrics_listen", ("0.0.0.0", 9464)),
    ('metrics_listen = "[::1]:9464"', "metrics_listen", ("::1", 9464)),
    ("", "metrics_listen", None),
    ("", "heartbeat_url", None),
])
def test_monitoring_keys_read(line, field, value, tmp_path):
    assert getattr(parse_registry(f"[bot]\n{line}\n", tmp_path / "runs.toml").bot, field) == value


def test_monitoring_is_off_unless_asked(tmp_path):
    services = type("S", (), {"registry": parse_registry("", tmp_path / "runs.toml"), "observer": None})()
    asyncio.run(monitoring.on_start(services))
    assert services.observer is None
