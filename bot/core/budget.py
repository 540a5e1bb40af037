"""Pure: a per-channel message budget (a token bucket), so a burst of alerts meets Slack's pace in order of importance."""

from __future__ import annotations

from dataclasses import dataclass

# Slack serves about one message a second per channel; a burst above that is queued by Slack,
# or refused with a 429. A short burst is fine, and part of it is kept for crashes.
MESSAGES_PER_S = 1.0
BURST = 10.0
RESERVED = 3.0  # tokens only the most important messages may take: a crash never waits behind a storm


@dataclass
class Bucket:
    """Tokens refill at `rate` a second up to `capacity`; a message takes one. Time comes in as `now`."""

    capacity: float = BURST
    rate: float = MESSAGES_PER_S
    tokens: float = BURST
    at: float | None = None

    def take(self, now: float, *, reserve: float = 0.0) -> bool:
        """Spend a token if more than `reserve` are left after refilling to `now`."""
        if self.at is not None:
            self.tokens = min(self.capacity, self.tokens + max(0.0, now - self.at) * self.rate)
        self.at = now
        if self.tokens - 1.0 < reserve - 1e-9:
            return False
        self.tokens -= 1.0
        return True
