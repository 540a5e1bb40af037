"""Why an SSH connection failed, as one sentence that names the host and the fix."""

from __future__ import annotations

import asyncio
import os
import socket
from enum import Enum
from typing import TYPE_CHECKING

import asyncssh

from bot.core import humanize as hz
from bot.core.redact import printable

if TYPE_CHECKING:
    from config.registry import Host

DEFAULT_KNOWN_HOSTS = ("~/.ssh/known_hosts", "/etc/ssh/ssh_known_hosts")


class Fault(Enum):
    """Why a connection failed, as a kind with fixed wording (a verdict goes to the alert channel: no
    exception's text reaches it but for a short, printable, redacted detail from the OS or the server)."""

    HOST_KEY = "host key unknown or changed"
    KNOWN_HOSTS_UNREADABLE = "known_hosts unreadable"
    KNOWN_HOSTS_INVALID = "known_hosts not a known_hosts file"
    KEY_REFUSED = "key refused"
    KEY_UNUSABLE = "key unusable"
    KEY_UNREADABLE = "key unreadable"
    NO_SUCH_NAME = "address does not resolve"
    REFUSED = "connection refused"
    RESET = "connection reset"
    TIMEOUT = "no answer"
    JUMP = "jump host could not reach the host"
    HANDSHAKE_LOST = "closed during the handshake"
    NETWORK = "network error"
    SSH = "SSH protocol error"
    OTHER = "failed"

    @property
    def kind(self) -> str:
        """The verdict's failure_kind: what the host-level outage and doctor tell apart."""
        if self in (Fault.HOST_KEY, Fault.KNOWN_HOSTS_UNREADABLE, Fault.KNOWN_HOSTS_INVALID):
            return "hostkey"
        return "auth" if self in (Fault.KEY_REFUSED, Fault.KEY_UNUSABLE, Fault.KEY_UNREADABLE) else "unreachable"


class SshFailure(Exception):
    """Could not get a usable connection; carries the user-facing verdict and its fault."""

    def __init__(self, message: str, fault: Fault) -> None:
        super().__init__(message)
        self.message, self.fault, self.kind = message, fault, fault.kind


DETAIL_CHARS = 80  # of an OS's or a server's own words in a verdict


def detail(text: object) -> str:
    """Outside words (an OS's strerror, a server's disconnect reason) fit for a verdict: one printable
    line, redacted, then cut."""
    return hz.trim(printable(str(text)), DETAIL_CHARS)


def known_hosts_files(t: Host) -> list[str]:
    """The known_hosts files to trust: the configured one, else the usual ones that exist."""
    if t.known_hosts:
        return [os.path.expanduser(t.known_hosts)]
    found = [p for p in map(os.path.expanduser, DEFAULT_KNOWN_HOSTS) if os.path.exists(p)]
    # Missing altogether: still name the user's file, so the error says what to create.
    return found or [os.path.expanduser(DEFAULT_KNOWN_HOSTS[0])]


def error_reason(exc: BaseException) -> str:
    """What went wrong on an open connection, in words safe to post: the server's or the OS's reason
    (short, redacted), else only the exception's type — its text may quote a file (asyncssh's
    "Invalid known hosts entry: <the line>")."""
    if isinstance(exc, (asyncssh.DisconnectError, asyncssh.ChannelOpenError)) and exc.reason:
        return detail(exc.reason)
    if isinstance(exc, OSError) and exc.strerror:
        return detail(exc.strerror)
    if isinstance(exc, EOFError):
        return "the connection ended"
    return type(exc).__name__


def connect_failure(exc: BaseException, t: Host, jump: Host | None) -> SshFailure:
    """Turn whatever connecting raised into a verdict that names the host and the fix."""
    if isinstance(exc, SshFailure):
        return exc
    via = f" via {jump.where}" if jump else ""
    if isinstance(exc, asyncssh.HostKeyNotVerifiable):
        return SshFailure(_hostkey_message(t), Fault.HOST_KEY)
    if isinstance(exc, asyncssh.PermissionDenied):
        keys = f"key {t.key}" if t.key else "the ssh-agent and default keys (~/.ssh/id_*)"
        return SshFailure(
            f"{t.where} refused our SSH key ({keys}): add the public key to "
            f"~{t.user}/.ssh/authorized_keys there, or set `key` for this host",
            Fault.KEY_REFUSED,
        )
    if isinstance(exc, asyncssh.KeyEncryptionError):
        return SshFailure(f"cannot use the SSH key {t.key} for {t.name}: it is passphrase-protected "
                          "(load it into ssh-agent, with `key` unset)", Fault.KEY_UNUSABLE)
    if isinstance(exc, asyncssh.KeyImportError):  # its text names what the file holds: never said
        return SshFailure(f"cannot use the SSH key {t.key} for {t.name}: not a private key asyncssh can read "
                          "(a passphrase-protected key must be loaded into ssh-agent, with `key` unset)",
                          Fault.KEY_UNUSABLE)
    if isinstance(exc, OSError) and exc.filename and t.key and os.path.expanduser(t.key) in str(exc.filename):
        return SshFailure(f"cannot read the SSH key {t.key} for {t.name}: {detail(exc.strerror)}", Fault.KEY_UNREADABLE)
    if isinstance(exc, OSError) and exc.filename and str(exc.filename) in known_hosts_files(t):
        return SshFailure(
            f"cannot read known_hosts {exc.filename} for {t.name}: {detail(exc.strerror)}; "
            f"see docs/ssh.md to add {t.address}'s host key",
            Fault.KNOWN_HOSTS_UNREADABLE,
        )
    if isinstance(exc, UnicodeDecodeError) or (isinstance(exc, ValueError) and str(exc).startswith("Invalid known hosts")):
        # asyncssh reads known_hosts as it connects: "Invalid known hosts entry: <the line>" quotes the
        # file. Say which file, never what is in it.
        return SshFailure(
            f"cannot use known_hosts {' or '.join(known_hosts_files(t))} for {t.name}: it is not a known_hosts "
            f"file (a line ssh-keyscan did not write); see docs/ssh.md to add {t.address}'s host key",
            Fault.KNOWN_HOSTS_INVALID,
        )
    if isinstance(exc, socket.gaierror):
        return SshFailure(f"cannot resolve {t.name}'s address {t.address!r}{via}: {detail(exc.strerror)}",
                          Fault.NO_SUCH_NAME)
    if isinstance(exc, ConnectionRefusedError):
        return SshFailure(f"{t.where} refused the connection{via}: is sshd running there?", Fault.REFUSED)
    if isinstance(exc, ConnectionResetError):
        return SshFailure(f"{t.where} reset the connection{via} (sshd restarting, or a firewall?)", Fault.RESET)
    if isinstance(exc, (asyncio.TimeoutError, TimeoutError)):
        return SshFailure(
            f"no answer from {t.where}{via} within {t.connect_timeout:g} s (host down, or a firewall dropping SSH?)",
            Fault.TIMEOUT,
        )
    if isinstance(exc, asyncssh.ChannelOpenError):  # the jump host could not reach the target
        return SshFailure(f"{jump.where if jump else 'the jump host'} could not reach {t.where}: {error_reason(exc)}",
                          Fault.JUMP)
    if isinstance(exc, asyncssh.ConnectionLost):
        return SshFailure(
            f"{t.where} closed the connection during the SSH handshake{via} (sshd overloaded, MaxStartups, or a firewall?)",
            Fault.HANDSHAKE_LOST,
        )
    if isinstance(exc, OSError):
        return SshFailure(f"cannot reach {t.where}{via}: {error_reason(exc)}", Fault.NETWORK)
    if isinstance(exc, asyncssh.Error):
        return SshFailure(f"SSH to {t.where}{via} failed: {error_reason(exc)}", Fault.SSH)
    return SshFailure(f"SSH to {t.where}{via} failed ({type(exc).__name__})", Fault.OTHER)


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
