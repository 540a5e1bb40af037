"""Throwaway OpenSSH servers on 127.0.0.1 for the SSH tests and benches: bot.demo.lab.sshd, which the demo shares."""

from bot.demo.lab.sshd import (PCT_BIN, SKIP_REASON, SSH_KEYGEN, SSHD, Sshd, SshLab, free_port,  # noqa: F401
                               have_sshd, keygen)
