"""bot.probe.ssh against a real OpenSSH sshd on 127.0.0.1, with the `pct` stand-in on its PATH."""

from __future__ import annotations

import asyncio
import os
import shlex
import socket
import time
from pathlib import Path

import asyncssh
import pytest

from bot.probe.ssh import SshHost, SshPool, SshRunner
from config.registry import Host, jump_host
from sshd import SKIP_REASON, SshLab, free_port, have_sshd, keygen

needs_sshd = pytest.mark.skipif(not have_sshd(), reason=SKIP_REASON)


@pytest.fixture
def lab(tmp_path: Path):
    lab = SshLab(tmp_path / "lab")
    yield lab
    lab.close()


@pytest.fixture
def pve1(lab: SshLab):
    srv = lab.sshd("pve1")
    srv.set_ct(201, "running")
    srv.set_ct(202, "stopped")
    return srv


@pytest.fixture
async def pool(pve1):
    pool = SshPool({"pve1": pve1.target()})
    yield pool
    await pool.close()


def _ok(result) -> bool:
    return result.failure is None


# --- without a server --------------------------------------------------------------------


def test_command_quotes_the_script_and_wraps_pct_and_a_remote_timeout() -> None:
    host = SshHost(Host("pve1", "127.0.0.1"))
    script = "echo \"it's\" $HOME; x='a b'\n"
    in_ct = SshRunner(host, 201).command(script, 20)
    on_host = SshRunner(host, None).command(script, 20)
    assert in_ct.endswith(f"pct exec 201 -- bash -c {shlex.quote(script)}")
    assert on_host.endswith(f" bash -c {shlex.quote(script)}") and "pct" not in on_host
    # The remote timeout fires after the client's, so the verdict is always ours.
    argv = shlex.split(in_ct)
    assert argv[:4] == ["timeout", "-k", "3", "22"]
    assert argv[-1] == script


async def test_verification_is_never_turned_off(monkeypatch, tmp_path: Path) -> None:
    seen = {}

    async def fake_connect(*args, **kw):
        seen.update(kw)
        raise ConnectionRefusedError(111, "refused")

    monkeypatch.setattr(asyncssh, "connect", fake_connect)
    monkeypatch.setenv("HOME", str(tmp_path))
    result = await SshRunner(SshHost(Host("pve1", "127.0.0.1")), None).run("true", timeout=5)
    assert result.failure_kind == "unreachable" and "pve1" in result.failure
    usual = [str(tmp_path / ".ssh/known_hosts"), "/etc/ssh/ssh_known_hosts"]
    assert seen["known_hosts"] == ([p for p in usual if os.path.exists(p)] or usual[:1])
    assert seen["config"] is None  # ~/.ssh/config cannot say `UserKnownHostsFile none`
    assert seen["client_keys"] == () and seen["agent_path"] == ()  # agent + default keys; None would disable


async def test_a_configured_key_is_the_only_one_offered(monkeypatch) -> None:
    seen = {}

    async def fake_connect(*args, **kw):
        seen.update(kw)
        raise ConnectionRefusedError(111, "refused")

    monkeypatch.setattr(asyncssh, "connect", fake_connect)
    target = Host("pve1", "127.0.0.1", key="/etc/runbot/id_ed25519", known_hosts="/etc/runbot/known_hosts")
    await SshRunner(SshHost(target), None).run("true", timeout=5)
    assert seen["client_keys"] == ["/etc/runbot/id_ed25519"] and seen["agent_path"] is None
    assert seen["known_hosts"] == ["/etc/runbot/known_hosts"]


@pytest.mark.parametrize(
    "exc,kind,words",
    [
        (socket.gaierror(-2, "Name or service not known"), "unreachable", "cannot resolve pve1's address"),
        (ConnectionRefusedError(111, "Connection refused"), "unreachable", "refused the connection"),
        (asyncio.TimeoutError(), "unreachable", "no answer from pve1"),
        (asyncssh.PermissionDenied("denied"), "auth", "refused our SSH key"),
        (asyncssh.ConnectionLost("reset"), "unreachable", "closed the connection during the SSH handshake"),
        (OSError(113, "No route to host"), "unreachable", "No route to host"),
    ],
)
async def test_each_connect_failure_has_its_own_verdict(monkeypatch, exc, kind, words) -> None:
    async def fake_connect(*args, **kw):
        raise exc

    monkeypatch.setattr(asyncssh, "connect", fake_connect)
    target = Host("pve1", "10.0.0.5", known_hosts=os.devnull)
    result = await SshRunner(SshHost(target), 201).run("true", timeout=5)
    assert result.failure_kind == kind
    assert words in result.failure and "pve1" in result.failure


def test_jump_host_parses_an_address_with_the_targets_key() -> None:
    t = Host("pve1", "10.0.0.5", user="root", key="/k", jump="ops@bastion:2222")
    j = jump_host(t, {})
    assert (j.address, j.port, j.user, j.key, j.jump) == ("bastion", 2222, "ops", "/k", None)
    j = jump_host(Host("pve1", "10.0.0.5", user="root", jump="bastion"), {})
    assert (j.address, j.port, j.user) == ("bastion", 22, "root")
    j = jump_host(Host("pve1", "10.0.0.5", jump="u@[fe80::1]:2200"), {})
    assert (j.address, j.port, j.user) == ("fe80::1", 2200, "u")


# --- against a real sshd -----------------------------------------------------------------


@needs_sshd
async def test_probe_on_host_and_in_container(pool: SshPool) -> None:
    r = await pool.runner("pve1", 201).run("echo out; echo err >&2; printf '\\xff\\x00'; exit 3", timeout=10)
    assert _ok(r), r.failure
    assert r.stdout == b"out\n\xff\x00" and r.stderr == b"err\n" and r.exit_status == 3
    r = await pool.runner("pve1", None).run("cat; echo done", timeout=10)  # stdin is closed
    assert _ok(r) and r.stdout == b"done\n"


@needs_sshd
async def test_script_with_quotes_and_newlines_arrives_intact(pool: SshPool) -> None:
    script = "x='it'\"'\"'s $HOME `id`'\nprintf '%s\\n' \"$x\" \"a\\\\b\""
    r = await pool.runner("pve1", 201).run(script, timeout=10)
    assert r.stdout == b"it's $HOME `id`\na\\b\n"


@needs_sshd
async def test_one_connection_serves_every_probe(pool: SshPool, pve1) -> None:
    for _ in range(10):
        assert _ok(await pool.runner("pve1", 201).run("true", timeout=10))
    results = await asyncio.gather(*(pool.runner("pve1", 201).run("echo $$", timeout=10) for _ in range(20)))
    assert all(_ok(r) for r in results)
    assert pool.stats()["pve1"]["connects"] == 1
    assert pve1.connections() == 1


@needs_sshd
async def test_lazy_connect(pool: SshPool, pve1) -> None:
    pool.runner("pve1", 201)
    assert pool.stats()["pve1"]["connects"] == 0 and pve1.connections() == 0


@needs_sshd
async def test_container_stopped_and_unknown(pool: SshPool) -> None:
    r = await pool.runner("pve1", 202).run("echo hi", timeout=10)
    assert r.failure_kind == "container" and "container 202 is stopped" in r.failure and "pve1" in r.failure
    r = await pool.runner("pve1", 999).run("echo hi", timeout=10)
    assert r.failure_kind == "container" and "container 999 is not on host pve1" in r.failure
    # The connection is fine afterwards.
    assert _ok(await pool.runner("pve1", 201).run("true", timeout=10))


@needs_sshd
async def test_keep_env_flag_is_accepted_by_the_stand_in(pve1, pool: SshPool) -> None:
    r = await pool.runner("pve1", None).run("pct exec 201 --keep-env 0 -- echo in; pct status 202; pct list", timeout=10)
    assert b"in\nstatus: stopped\n" in r.stdout and b"201        running" in r.stdout


@needs_sshd
async def test_sshd_stopped_answers_within_connect_timeout(pve1) -> None:
    pve1.stop()
    pool = SshPool({"pve1": pve1.target(connect_timeout=2.0)})
    started = time.monotonic()
    r = await pool.runner("pve1", 201).run("true", timeout=10)
    assert time.monotonic() - started < 2.0 + 1.0
    assert r.failure_kind == "unreachable" and "pve1" in r.failure and "refused the connection" in r.failure
    await pool.close()


@needs_sshd
async def test_silent_server_times_out_within_connect_timeout(lab) -> None:
    # Accepts TCP, never speaks SSH (a hung sshd, a black-holing middlebox).
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        port = silent.getsockname()[1]
        target = Host("pve9", "127.0.0.1", port=port, key=str(lab.client_key), known_hosts=str(lab.known_hosts),
                           connect_timeout=1.0)
        pool = SshPool({"pve9": target})
        started = time.monotonic()
        results = await asyncio.gather(*(pool.runner("pve9", 201).run("true", timeout=10) for _ in range(20)))
        elapsed = time.monotonic() - started
        await pool.close()
    # One shared attempt: 20 queued probes do not pay 20 connect timeouts.
    assert elapsed < 1.0 + 1.0
    assert all(r.failure_kind == "unreachable" and "no answer from pve9" in r.failure for r in results)
    assert pool.stats()["pve9"]["connects"] == 0


@needs_sshd
async def test_sshd_killed_mid_probe_then_back_retries_on_a_fresh_connection(pve1, pool: SshPool) -> None:
    assert _ok(await pool.runner("pve1", 201).run("true", timeout=10))
    task = asyncio.create_task(pool.runner("pve1", 201).run("sleep 1; echo done", timeout=10))
    await asyncio.sleep(0.3)
    pve1.stop()  # the listener and every connection's process
    pve1.start()
    r = await task
    assert _ok(r) and r.stdout == b"done\n"
    assert pool.stats()["pve1"]["connects"] == 2


@needs_sshd
async def test_sshd_killed_mid_probe_next_probe_reconnects(pve1, pool: SshPool) -> None:
    assert _ok(await pool.runner("pve1", 201).run("true", timeout=10))
    task = asyncio.create_task(pool.runner("pve1", 201).run("sleep 1; echo done", timeout=10))
    await asyncio.sleep(0.3)
    pve1.stop()
    r = await task
    assert r.failure_kind == "unreachable" and "pve1" in r.failure
    pve1.start()
    r = await pool.runner("pve1", 201).run("echo back", timeout=10)
    assert _ok(r) and r.stdout == b"back\n"
    assert pool.stats()["pve1"]["connects"] == 2


@needs_sshd
async def test_hanging_command_times_out_and_the_connection_stays(pve1, pool: SshPool) -> None:
    assert _ok(await pool.runner("pve1", 201).run("true", timeout=10))
    started = time.monotonic()
    r = await pool.runner("pve1", 201).run("sleep 4242", timeout=1)
    assert r.failure_kind == "timeout" and "1 s" in r.failure and "pve1" in r.failure
    assert time.monotonic() - started < 1.5
    r = await pool.runner("pve1", 201).run("echo still here", timeout=10)
    assert _ok(r) and r.stdout == b"still here\n"
    assert pool.stats()["pve1"]["connects"] == 1
    # The remote `timeout` ends the hung command on the host (OpenSSH will not signal root's sessions).
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and _pgrep("sleep 4242"):
        await asyncio.sleep(0.2)
    assert not _pgrep("sleep 4242")


@needs_sshd
async def test_a_cancelled_probe_frees_its_channel(pool: SshPool) -> None:
    with pytest.raises(asyncio.TimeoutError):
        await asyncio.wait_for(pool.runner("pve1", 201).run("sleep 4545", timeout=3), 0.5)
    r = await pool.runner("pve1", 201).run("echo next", timeout=10)
    assert r.stdout == b"next\n" and pool.stats()["pve1"]["active_channels"] == 0


@needs_sshd
async def test_hung_probes_never_wedge_a_host(lab) -> None:
    srv = lab.sshd("tight", max_sessions=3)
    srv.set_ct(201, "running")
    pool = SshPool({"tight": srv.target(max_channels=3)})
    hung = await asyncio.gather(*(pool.runner("tight", 201).run("sleep 4343", timeout=1) for _ in range(3)))
    assert all(r.failure_kind == "timeout" for r in hung)
    # sshd keeps those sessions until the remote timeout ends them; probes wait, then run.
    results = await asyncio.gather(*(pool.runner("tight", 201).run("echo ok", timeout=15) for _ in range(12)))
    assert [r.failure for r in results if r.failure] == []
    stats = pool.stats()["tight"]
    assert stats["channel_open_failures"] == 0 and stats["connects"] == 1
    await pool.close()


@needs_sshd
async def test_unknown_host_key_is_refused(lab) -> None:
    srv = lab.sshd("newbox", trust=False)
    pool = SshPool({"newbox": srv.target()})
    r = await pool.runner("newbox", None).run("true", timeout=10)
    assert r.failure_kind == "hostkey"
    assert "not in" in r.failure and "ssh-keyscan -p" in r.failure and "newbox" in r.failure
    await pool.close()


@needs_sshd
async def test_changed_host_key_is_refused(lab) -> None:
    srv = lab.sshd("reinstalled", trust=False)
    impostor = keygen(lab.dir / "impostor")
    lab.trust(srv, Path(f"{impostor}.pub"))  # known_hosts holds another key for this host:port
    pool = SshPool({"reinstalled": srv.target()})
    r = await pool.runner("reinstalled", None).run("true", timeout=10)
    assert r.failure_kind == "hostkey"
    assert "does NOT match" in r.failure and "ssh-keygen -R" in r.failure and "reinstalled" in r.failure
    await pool.close()


@needs_sshd
async def test_missing_known_hosts_file_is_refused(pve1) -> None:
    pool = SshPool({"pve1": pve1.target(known_hosts=str(pve1.dir / "nope"))})
    r = await pool.runner("pve1", None).run("true", timeout=10)
    assert r.failure_kind == "hostkey" and "nope" in r.failure
    await pool.close()


# A `.env` where known_hosts or the key should be: asyncssh's "Invalid known hosts entry: <the line>"
# became the run's verdict and went to the alert channel. What a file holds is never said.
DOTENV_SECRETS = ("xoxb-123456789012-abcdefghijkl", "hunter2-db-pass", "0123456789abcdef0123456789abcdef")
DOTENV = f"SLACK_BOT_TOKEN={DOTENV_SECRETS[0]}\nDB_PASS={DOTENV_SECRETS[1]}\nWANDB_KEY={DOTENV_SECRETS[2]}\n"


def _quotes_the_file(text: str) -> list[str]:
    return [w for w in (*DOTENV_SECRETS, "SLACK_BOT_TOKEN", "DB_PASS", "WANDB", "xoxb") if w in text]


def _posted(failure: str, kind: str | None) -> list[str]:
    """The verdict an unreachable run gets, as the alert channel and the CLI would show it."""
    from bot.core.alerts import RunState, Status
    from bot.core.diagnose import unreachable
    from bot.render import alerts as render_alerts
    from bot.render import text as render_text
    from tests.credential_shapes import strings
    from tests.test_diagnose import Run

    v = unreachable(Run(), failure, kind)
    state = RunState(Status.OPEN, None, seq=1, announced=True, opened_at=1.0, changed_at=1.0, headline=v.headline)
    return [render_text.status(v), *strings(render_alerts.parent("dflash", state, v, 2.0))]


@needs_sshd
@pytest.mark.parametrize("what", ["known_hosts", "key"])
@pytest.mark.parametrize("content", [DOTENV.encode(), b"\xff\xfe\x00" + DOTENV.encode()], ids=["dotenv", "binary"])
async def test_a_secrets_file_where_ssh_expects_its_own_is_never_quoted(pve1, tmp_path: Path, what, content) -> None:
    dotenv = tmp_path / ".env"
    dotenv.write_bytes(content)
    pool = SshPool({"pve1": pve1.target(**{what: str(dotenv)})})
    r = await pool.runner("pve1", 201).run("true", timeout=10)
    await pool.close()
    assert r.failure_kind == ("hostkey" if what == "known_hosts" else "auth"), r.failure
    assert str(dotenv) in r.failure and ("not a known_hosts file" in r.failure or "not a private key" in r.failure)
    assert _quotes_the_file(r.failure) == [] and r.failure.isprintable()
    assert [t for t in _posted(r.failure, r.failure_kind) if _quotes_the_file(t)] == []


HOSTILE_REASON = "\x1b[2J" + "x" * 300 + " token=hunter2hunter2 hf_" + "a1B2c3D4e5" * 4 + " \u202e" + "Z" * 300


@pytest.mark.parametrize("exc,fault", [
    (asyncssh.ProtocolError(HOSTILE_REASON), "SSH"),
    (asyncssh.KeyExchangeFailed(HOSTILE_REASON), "SSH"),
    (asyncssh.ChannelOpenError(2, HOSTILE_REASON), "JUMP"),
    (OSError(5, HOSTILE_REASON), "NETWORK"),
    (socket.gaierror(-2, HOSTILE_REASON), "NO_SUCH_NAME"),
    (ValueError("Invalid known hosts entry: " + HOSTILE_REASON), "KNOWN_HOSTS_INVALID"),
    (asyncssh.KeyImportError("Invalid " + HOSTILE_REASON + " private key"), "KEY_UNUSABLE"),
    (RuntimeError(HOSTILE_REASON), "OTHER"),
], ids=lambda x: type(x).__name__ if isinstance(x, BaseException) else x)
async def test_every_transport_error_is_typed_short_redacted_and_printable(monkeypatch, exc, fault) -> None:
    """Whatever the exception says (a server's disconnect reason, an OS's text, a file's line), the verdict
    is its fault's fixed sentence with at most DETAIL_CHARS of outside words: printable, redacted, cut after."""
    async def fake_connect(*args, **kw):
        raise exc

    monkeypatch.setattr(asyncssh, "connect", fake_connect)
    target = Host("pve1", "10.0.0.5", known_hosts=os.devnull, key="/etc/runbot/id_ed25519")
    result = await SshRunner(SshHost(target), 201).run("true", timeout=5)
    failure = result.failure
    assert failure.isprintable() and "hunter2" not in failure and "a1B2c3D4e5" not in failure
    assert "x" * 81 not in failure and "Z" not in failure and "pve1" in failure
    assert len(failure) < 400

    from bot.probe.ssh_errors import DETAIL_CHARS, Fault, connect_failure

    assert DETAIL_CHARS <= 80 and connect_failure(exc, target, None).fault is Fault[fault]
    assert result.failure_kind == Fault[fault].kind


async def test_an_error_on_an_open_connection_is_said_short_and_redacted() -> None:
    from bot.probe.ssh_errors import DETAIL_CHARS, error_reason

    for exc in (asyncssh.ConnectionLost(HOSTILE_REASON), OSError(104, HOSTILE_REASON), ValueError(HOSTILE_REASON)):
        said = error_reason(exc)
        assert said.isprintable() and "hunter2" not in said and len(said) <= DETAIL_CHARS, said
    assert error_reason(ValueError("Invalid known hosts entry: DB_PASS=x")) == "ValueError"


@needs_sshd
async def test_unauthorized_key_is_an_auth_failure(lab, pve1) -> None:
    stranger = keygen(lab.dir / "stranger")
    pool = SshPool({"pve1": pve1.target(key=str(stranger))})
    r = await pool.runner("pve1", 201).run("true", timeout=10)
    assert r.failure_kind == "auth" and "refused our SSH key" in r.failure and "pve1" in r.failure
    await pool.close()


@needs_sshd
async def test_30_concurrent_probes_on_maxsessions_10(pool: SshPool) -> None:
    results = await asyncio.gather(*(pool.runner("pve1", 201).run("sleep 0.2; echo ok", timeout=20) for _ in range(30)))
    assert [r.failure for r in results if r.failure] == []
    stats = pool.stats()["pve1"]
    assert stats["peak_channels"] == 8 and stats["connects"] == 1 and stats["channel_open_failures"] == 0


@needs_sshd
async def test_200_probes_on_one_host_without_a_channel_open_error(pool: SshPool, pve1, tmp_path: Path) -> None:
    log = tmp_path / "train.log"
    log.write_bytes(b"step 1 loss 2.0\n" * 8000)
    script = f"stat -c %s {log}; tail -c 65536 {log} | grep -c step"
    results = await asyncio.gather(*(pool.runner("pve1", 201).run(script, timeout=30) for _ in range(200)))
    assert [r.failure for r in results if r.failure] == []
    assert all(r.stdout == b"128000\n4096\n" for r in results)
    stats = pool.stats()["pve1"]
    assert stats["connects"] == 1 and stats["peak_channels"] == 8 and stats["channel_open_failures"] == 0
    assert pve1.connections() == 1


@needs_sshd
async def test_jump_host(lab) -> None:
    bastion = lab.sshd("bastion")
    inner = lab.sshd("inner")
    inner.set_ct(201, "running")
    target = inner.target(jump=f"{lab.user}@127.0.0.1:{bastion.port}")
    pool = SshPool({"inner": target})
    r = await pool.runner("inner", 201).run("echo via jump", timeout=10)
    assert _ok(r), r.failure
    assert r.stdout == b"via jump\n"
    stats = pool.stats()
    assert stats["inner"]["connects"] == 1
    assert [s["connects"] for name, s in stats.items() if name.startswith("jump:")] == [1]
    assert bastion.connections() == 1
    await pool.close()


@needs_sshd
async def test_jump_may_name_another_configured_host(lab) -> None:
    bastion = lab.sshd("bastion")
    inner = lab.sshd("inner")
    pool = SshPool({"bastion": bastion.target(), "inner": inner.target(jump="bastion")})
    r = await pool.runner("inner", None).run("echo hi", timeout=10)
    assert r.stdout == b"hi\n", r.failure
    # The bastion's own probes and the tunnel share its one connection.
    assert _ok(await pool.runner("bastion", None).run("true", timeout=10))
    assert pool.stats()["bastion"]["connects"] == 1 and bastion.connections() == 1
    await pool.close()


@needs_sshd
async def test_jump_host_down_names_the_jump_host(lab) -> None:
    inner = lab.sshd("inner")
    pool = SshPool({"inner": inner.target(jump=f"127.0.0.1:{free_port()}")})
    r = await pool.runner("inner", None).run("true", timeout=10)
    assert r.failure_kind == "unreachable" and "jump host" in r.failure
    await pool.close()


@needs_sshd
async def test_close_closes_the_connection(pve1) -> None:
    pool = SshPool({"pve1": pve1.target()})
    assert _ok(await pool.runner("pve1", None).run("true", timeout=10))
    await pool.close()
    deadline = time.monotonic() + 5
    while pve1.connections() and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    assert pve1.connections() == 0


def _pgrep(pattern: str) -> bool:
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                cmd = Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ")
            except OSError:
                continue
            if cmd.strip() == pattern.encode():
                return True
    return False
