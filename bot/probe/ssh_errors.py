"""Why an SSH connection failed, as one sentence that names the host and the fix."""

from __future__ import annotations

import asyncio
import os
import socket
from typing import TYPE_CHECKING

import asyncssh

if TYPE_CHECKING:
    from config.registry import Host

DEFAULT_KNOWN_HOSTS = ("~/.ssh/known_hosts", "/etc/ssh/ssh_known_hosts")


class SshFailure(Exception):
    """Could not get a usable connection; carries the user-facing verdict."""

    def __init__(self, message: str, kind: str) -> None:
        super().__init__(message)
        self.message, self.kind = message, kind


def known_hosts_files(t: Host) -> list[str]:
    """The known_hosts files to trust: the configured one, else the usual ones that exist."""
    if t.known_hosts:
        return [os.path.expanduser(t.known_hosts)]
    found = [p for p in map(os.path.expanduser, DEFAULT_KNOWN_HOSTS) if os.path.exists(p)]
    # Missing altogether: still name the user's file, so the error says what to create.
    return found or [os.path.expanduser(DEFAULT_KNOWN_HOSTS[0])]


def error_reason(exc: BaseException) -> str:
    """What went wrong, in the exception's own words: asyncssh's reason, else its message, else its type."""
    return getattr(exc, "reason", None) or str(exc) or type(exc).__name__


def connect_failure(exc: BaseException, t: Host, jump: Host | None) -> SshFailure:
    """Turn whatever connecting raised into a verdict that names the host and the fix."""
    if isinstance(exc, SshFailure):
        return exc
    via = f" via {jump.where}" if jump else ""
    if isinstance(exc, asyncssh.HostKeyNotVerifiable):
        return SshFailure(_hostkey_message(t), "hostkey")
    if isinstance(exc, asyncssh.PermissionDenied):
        keys = f"key {t.key}" if t.key else "the ssh-agent and default keys (~/.ssh/id_*)"
        return SshFailure(
            f"{t.where} refused our SSH key ({keys}): add the public key to "
            f"~{t.user}/.ssh/authorized_keys there, or set `key` for this host",
            "auth",
        )
    if isinstance(exc, (asyncssh.KeyImportError, asyncssh.KeyEncryptionError)):
        return SshFailure(
            f"cannot use the SSH key {t.key} for {t.name}: {exc} "
            "(a passphrase-protected key must be loaded into ssh-agent, with `key` unset)",
            "auth",
        )
    if isinstance(exc, OSError) and exc.filename and t.key and os.path.expanduser(t.key) in str(exc.filename):
        return SshFailure(f"cannot read the SSH key {t.key} for {t.name}: {exc.strerror}", "auth")
    if isinstance(exc, OSError) and exc.filename and str(exc.filename) in known_hosts_files(t):
        return SshFailure(
            f"cannot read known_hosts {exc.filename} for {t.name}: {exc.strerror}; "
            f"see docs/ssh.md to add {t.address}'s host key",
            "hostkey",
        )
    if isinstance(exc, socket.gaierror):
        return SshFailure(f"cannot resolve {t.name}'s address {t.address!r}{via}: {exc.strerror}", "unreachable")
    if isinstance(exc, ConnectionRefusedError):
        return SshFailure(f"{t.where} refused the connection{via}: is sshd running there?", "unreachable")
    if isinstance(exc, ConnectionResetError):
        return SshFailure(f"{t.where} reset the connection{via} (sshd restarting, or a firewall?)", "unreachable")
    if isinstance(exc, (asyncio.TimeoutError, TimeoutError)):
        return SshFailure(
            f"no answer from {t.where}{via} within {t.connect_timeout:g} s (host down, or a firewall dropping SSH?)",
            "unreachable",
        )
    if isinstance(exc, asyncssh.ChannelOpenError):  # the jump host could not reach the target
        return SshFailure(f"{jump.where if jump else 'the jump host'} could not reach {t.where}: {exc.reason}", "unreachable")
    if isinstance(exc, asyncssh.ConnectionLost):
        return SshFailure(
            f"{t.where} closed the connection during the SSH handshake{via} (sshd overloaded, MaxStartups, or a firewall?)",
            "unreachable",
        )
    if isinstance(exc, OSError):
        return SshFailure(f"cannot reach {t.where}{via}: {exc.strerror or exc}", "unreachable")
    return SshFailure(f"SSH to {t.where}{via} failed: {error_reason(exc)}", "unreachable")


def _hostkey_message(t: Host) -> str:
    """Unknown key or changed key: the fixes differ, so say which."""
    files = known_hosts_files(t)
    path = " or ".join(files)
    entry = t.address if t.port == 22 else f"[{t.address}]:{t.port}"
    try:
        keys, ca_keys, *_ = asyncssh.read_known_hosts(files).match(t.address, t.address, t.port)
        known = bool(keys or ca_keys)
    except (OSError, ValueError, asyncssh.Error):
        known = False
    if known:
        return (
            f"{t.where} presented a host key that does NOT match {path}: refusing to connect. "
            "If the host was reinstalled, verify its new fingerprint out of band, then "
            f"`ssh-keygen -R '{entry}' -f {files[0]}` and add the new key (docs/ssh.md)"
        )
    return (
        f"{t.where}'s host key is not in {path}: refusing to connect to an unverified host. "
        f"Add it with `ssh-keyscan -p {t.port} {t.address} >> {files[0]}` and check the fingerprint "
        "against the host's own `ssh-keygen -lf /etc/ssh/ssh_host_ed25519_key.pub` (docs/ssh.md)"
    )
