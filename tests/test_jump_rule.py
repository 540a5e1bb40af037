"""One rule for `jump`, from the config file to the connection: what check-config accepts is what the transport dials."""

from __future__ import annotations

from pathlib import Path

import pytest

from bot.probe.targets import Targets
from config.registry import ConfigFaults, faults_of, parse_registry
from tests.sshd import SKIP_REASON, SshLab, free_port, have_sshd


def _host(name: str, srv_port: int, lab: SshLab, jump: str | None) -> str:
    return (f'[hosts.{name}]\naddress = "127.0.0.1"\nport = {srv_port}\nuser = "{lab.user}"\n'
            f'key = "{lab.client_key}"\nknown_hosts = "{lab.known_hosts}"\nconnect_timeout = "5s"\n'
            + (f'jump = "{jump}"\n' if jump else ""))


@pytest.mark.parametrize("hosts, fault", [
    ('[hosts.a]\naddress = "10.0.0.1"\njump = "a"\n', "jumps through itself"),
    ('[hosts.a]\naddress = "10.0.0.1"\njump = "b"\n[hosts.b]\naddress = "10.0.0.2"\njump = "a"\n',
     "jump hosts loop (a -> b -> a)"),
])
def test_the_config_refuses_a_jump_that_cannot_be_dialled(tmp_path: Path, hosts: str, fault: str) -> None:
    with pytest.raises(ConfigFaults) as caught:
        parse_registry(hosts, tmp_path / "runs.toml")
    assert any(f.key == "hosts.a.jump" and fault in str(f) for f in faults_of(caught.value)), faults_of(caught.value)


@pytest.mark.skipif(not have_sshd(), reason=SKIP_REASON)
async def test_a_named_jump_host_brings_its_own_jump_and_an_unknown_name_is_an_address(tmp_path: Path) -> None:
    lab = SshLab(tmp_path / "lab")
    try:
        bastion, mid, inner = lab.sshd("bastion"), lab.sshd("mid"), lab.sshd("inner")
        inner.set_ct(201, "running")
        dead = free_port()
        text = (_host("mid", mid.port, lab, f"{lab.user}@127.0.0.1:{bastion.port}")  # an address: no such host name
                + _host("inner", inner.port, lab, "mid")  # a host name: mid, and mid's own jump with it
                + _host("lost", inner.port, lab, f"127.0.0.1:{dead}")
                + f'[runs.r]\nhost = "inner"\ncontainer = 201\nlog = "/x.log"\n'
                + '[runs.l]\nhost = "lost"\nlog = "/x.log"\n')
        registry = parse_registry(text, tmp_path / "runs.toml")
        targets = Targets(registry)
        try:
            result = await targets.runner_for(registry.runs["r"]).run("echo through two hops", timeout=10)
            assert result.failure is None and result.stdout == b"through two hops\n", result.failure
            # Each hop carried exactly one connection: inner's came through mid's, mid's through bastion's.
            assert (bastion.connections(), mid.connections(), inner.connections()) == (1, 1, 1)
            lost = await targets.runner_for(registry.runs["l"]).run("true", timeout=10)
            assert lost.failure_kind == "unreachable" and f"jump host 127.0.0.1 ({lab.user}@127.0.0.1:{dead})" in lost.failure
        finally:
            await targets.close()
    finally:
        lab.close()
