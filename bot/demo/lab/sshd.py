"""Throwaway OpenSSH servers on 127.0.0.1, with their own keys and known_hosts: the SSH tests', benches' and demo's."""

from __future__ import annotations

import os
import shlex
import shutil
import signal
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

SSHD = "/usr/sbin/sshd" if os.path.exists("/usr/sbin/sshd") else shutil.which("sshd")
SSH_KEYGEN = shutil.which("ssh-keygen")
PCT_BIN = Path(__file__).resolve().parent / "bin"  # the `pct` stand-in (package data)
SKIP_REASON = "OpenSSH server not installed (/usr/sbin/sshd); `.ci/run` installs openssh-server"


def have_sshd() -> bool:
    """True when an sshd binary and ssh-keygen are available."""
    return bool(SSHD and SSH_KEYGEN)


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nobody listens on right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def keygen(path: Path) -> Path:
    """Write an ed25519 key pair without passphrase at path (and path.pub)."""
    subprocess.run(
        [SSH_KEYGEN, "-q", "-t", "ed25519", "-N", "", "-C", "runbot-test", "-f", str(path)],
        check=True,
    )
    return path


def _children(pid: int) -> list[int]:
    """Every descendant of pid (sshd's per-connection children call setsid, so no pgid kill)."""
    parents: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        parents.setdefault(ppid, []).append(int(entry))
    out, todo = [], [pid]
    while todo:
        for child in parents.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


@dataclass
class Sshd:
    """One sshd process with its own host key and config, sharing the lab's client key."""

    lab: "SshLab"
    name: str
    port: int
    dir: Path
    max_sessions: int = 10
    log_level: str = "ERROR"
    pct: bool = True  # False: no `pct` on its PATH (not a Proxmox node)
    extra_bin: Path | None = None  # first on the sessions' PATH (a host's stand-in nvidia-smi)
    tmpdir: Path | None = None  # the sessions' TMPDIR (a test watches what a probe leaves there)
    proc: subprocess.Popen | None = None

    @property
    def host_key(self) -> Path:
        return self.dir / "host_key"

    @property
    def pct_state(self) -> Path:
        return self.dir / "pct"

    def write_config(self) -> Path:
        # SHLVL=1 stops bash from sourcing ~/.bashrc for ssh commands (this machine's is slow,
        # a stock Proxmox root's is not): the lab should time the transport, not a dotfile.
        first = f"{self.extra_bin}:" if self.extra_bin else ""
        env = (
            f"PATH={first}{f'{PCT_BIN}:' if self.pct else ''}/usr/local/bin:/usr/bin:/bin PCT_STATE_DIR={self.pct_state} "
            f"PCT_NODE={self.name} SHLVL=1" + (f" TMPDIR={self.tmpdir}" if self.tmpdir else "")
        )
        cfg = self.dir / "sshd_config"
        cfg.write_text(
            "\n".join(
                [
                    f"Port {self.port}",
                    "ListenAddress 127.0.0.1",
                    f"HostKey {self.host_key}",
                    f"PidFile {self.dir / 'sshd.pid'}",
                    f"AuthorizedKeysFile {self.lab.authorized_keys}",
                    "PubkeyAuthentication yes",
                    "PasswordAuthentication no",
                    "KbdInteractiveAuthentication no",
                    "UsePAM no",
                    "StrictModes no",
                    "PermitRootLogin prohibit-password",
                    f"MaxSessions {self.max_sessions}",
                    "AllowTcpForwarding yes",
                    "X11Forwarding no",
                    "PrintMotd no",
                    "PrintLastLog no",
                    f"LogLevel {self.log_level}",
                    f"SetEnv {env}",
                    "",
                ]
            )
        )
        return cfg

    def start(self, timeout: float = 10.0) -> "Sshd":
        """Start (or restart) sshd on the same port and wait until it listens."""
        cfg = self.write_config()
        log = open(self.dir / "sshd.log", "ab")
        # sshd must be started by absolute path (it re-executes itself per connection).
        self.proc = subprocess.Popen(
            [SSHD, "-D", "-f", str(cfg), "-E", str(self.dir / "sshd.log")],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=log,
        )
        log.close()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"sshd exited {self.proc.returncode}: {self.log()[-2000:]}")
            if _listening(self.port):
                return self
            time.sleep(0.02)
        raise RuntimeError(f"sshd did not listen on {self.port}: {self.log()[-2000:]}")

    def _signal(self, sig: int, *, children: bool) -> None:
        if self.proc is None:
            return
        pids = ([self.proc.pid] + _children(self.proc.pid)) if children else [self.proc.pid]
        for pid in pids:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        self.proc.wait(timeout=10)
        self.proc = None

    def stop(self) -> None:
        """Stop listening and drop every open connection (like `systemctl stop ssh` + reboot)."""
        self._signal(signal.SIGKILL, children=True)
        # A child forked just before the kill may hold the listening socket a moment longer.
        deadline = time.monotonic() + 5
        while _listening(self.port) and time.monotonic() < deadline:
            time.sleep(0.02)

    def kill_listener(self) -> None:
        """Kill only the listener; established connections live on, as with OpenSSH."""
        self._signal(signal.SIGKILL, children=False)

    def connections(self) -> int:
        """How many per-connection sshd children are alive."""
        return 0 if self.proc is None else sum(
            1 for pid in _children(self.proc.pid) if _ppid(pid) == self.proc.pid
        )

    def cpu_seconds(self) -> float:
        """CPU time this server and everything it ran have used (its sessions' commands too)."""
        if self.proc is None:
            return 0.0
        total = 0
        # Exited sessions are in their reaper's cutime/cstime; live processes count themselves.
        for pid in [self.proc.pid] + _children(self.proc.pid):
            try:
                fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            total += sum(int(x) for x in fields[11:15])  # utime stime cutime cstime
        return total / os.sysconf("SC_CLK_TCK")

    def set_ct(self, ct: int, state: str | None, name: str = "") -> None:
        """Make container ct 'running', 'stopped', or unknown (None) to the pct stand-in."""
        for s in ("running", "stopped"):
            (self.pct_state / f"{ct}.{s}").unlink(missing_ok=True)
        if state:
            (self.pct_state / f"{ct}.{state}").write_text(name or f"ct{ct}")

    def set_smi(self, ct: int, answer: str | None) -> None:
        """Give container ct an nvidia-smi that prints `answer` (exit 0); "fail": one that cannot reach the
        driver (exit 9, as the real one); None: none on its PATH (this machine has no real one)."""
        bin_dir = self.pct_state / f"{ct}.bin"
        shutil.rmtree(bin_dir, ignore_errors=True)
        if answer is None:
            return
        bin_dir.mkdir()
        body = ("echo 'NVIDIA-SMI has failed because it could not communicate with the NVIDIA driver.'; exit 9"
                if answer == "fail" else f"printf '%s\\n' {shlex.quote(answer)}")
        smi = bin_dir / "nvidia-smi"
        smi.write_text(f"#!/bin/sh\n{body}\n")
        smi.chmod(0o755)

    def log(self) -> str:
        p = self.dir / "sshd.log"
        return p.read_text(errors="replace") if p.exists() else ""

    def target(self, **kw):
        """A config Host for this server, trusting the lab's known_hosts and client key."""
        from config.registry import Host

        base = dict(
            name=self.name,
            address="127.0.0.1",
            port=self.port,
            user=self.lab.user,
            key=str(self.lab.client_key),
            known_hosts=str(self.lab.known_hosts),
            connect_timeout=5.0,
            command_timeout=30.0,
            keepalive=15.0,
        )
        base.update(kw)
        return Host(**base)


def _listening(port: int) -> bool:
    """Whether a socket listens on 127.0.0.1:port (read from the kernel: connecting to check
    would cost sshd a connection child and a log line)."""
    want = f"0100007F:{port:04X}"
    try:
        lines = Path("/proc/net/tcp").read_text().splitlines()[1:]
    except OSError:
        return False
    return any(f[1] == want and f[3] == "0A" for f in (l.split() for l in lines))


def _ppid(pid: int) -> int:
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    except OSError:
        return -1


@dataclass
class SshLab:
    """A temp dir with one client key, one known_hosts and any number of sshds."""

    dir: Path
    servers: list[Sshd] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        self.user = _username()
        self.client_key = keygen(self.dir / "client_key")
        self.authorized_keys = self.dir / "authorized_keys"
        self.authorized_keys.write_text((self.dir / "client_key.pub").read_text())
        self.known_hosts = self.dir / "known_hosts"
        self.known_hosts.write_text("")
        if os.geteuid() == 0:
            # Debian's sshd refuses to start without its privilege-separation directory,
            # which the ssh.service unit normally creates.
            os.makedirs("/run/sshd", mode=0o755, exist_ok=True)

    def sshd(self, name: str = "pve1", *, max_sessions: int = 10, log_level: str = "ERROR",
             trust: bool = True, pct: bool = True, extra_bin: Path | None = None, tmpdir: Path | None = None) -> Sshd:
        """Create and start an sshd; trust=False leaves its key out of known_hosts, pct=False its PATH without pct;
        extra_bin goes first on its PATH; tmpdir is its sessions' TMPDIR."""
        d = self.dir / f"sshd-{name}"
        d.mkdir()
        srv = Sshd(self, name, free_port(), d, max_sessions=max_sessions, log_level=log_level, pct=pct, extra_bin=extra_bin,
                   tmpdir=tmpdir)
        srv.pct_state.mkdir()
        keygen(srv.host_key)
        if trust:
            self.trust(srv)
        self.servers.append(srv)
        return srv.start()

    def trust(self, srv: Sshd, key_pub: Path | None = None) -> None:
        """Add srv's host key (or another public key, to fake a changed key) to known_hosts."""
        pub = (key_pub or srv.host_key.with_suffix(".pub")).read_text().split()
        with open(self.known_hosts, "a") as f:
            f.write(f"[127.0.0.1]:{srv.port} {pub[0]} {pub[1]}\n")

    def close(self) -> None:
        for srv in self.servers:
            srv.stop()


def _username() -> str:
    import pwd

    return pwd.getpwuid(os.getuid()).pw_name
