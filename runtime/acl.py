"""What the Redis user of a worker or a client must be allowed, and what a refusal says.

Keys: everything under ``<prefix>:``. Channels: everything under ``<prefix>:``, one
rule ``&<prefix>:*``. Every channel is a shard channel named inside a partition's
hash tag (``shard_channels.py``): ``<prefix>:{<prefix>:pN}:idle:<url>`` (a commit
publishes there, a waiting client subscribes), ``<prefix>:{<prefix>:pN}:cancel`` (a
client publishes there, a worker subscribes while it holds the partition) and, on a
Redis Cluster, the inbox key itself (the doorbell: the scripts publish, the worker
subscribes). Only exact channels are subscribed (``SSUBSCRIBE``, no pattern), so the
rule ``&<prefix>:*`` grants them all. The README ("Redis ACLs") has the
``ACL SETUSER`` lines.

Every channel a user may lack is optional to the runtime's correctness (notices
are advisory; a cancel request is also an input in the entity's log), so a refusal
is logged with the rule to add, and the runtime goes on. :class:`Refusals` keeps
that log readable: the first refusal of a kind is logged at once, later ones at
most once a minute, with their count.
"""

from __future__ import annotations

import logging
import time

ACL_DOCS = 'README, "Redis ACLs"'
REPORT_EVERY_S = 60.0


def missing_right(rule: str, refused: str) -> str:
    """The first words of a refusal's log line: what was refused, and the rule to add."""
    return (
        f"Redis refused to {refused}: the Redis user needs the channel right {rule} "
        f"(see the {ACL_DOCS})"
    )


class Refusals:
    """Logs one kind of refusal: at once the first time, then at most every
    :data:`REPORT_EVERY_S` seconds, saying how many came meanwhile."""

    def __init__(self, log: logging.Logger, level: int = logging.ERROR) -> None:
        self._log = log
        self._level = level
        self._last: float | None = None
        self._unreported = 0

    def report(self, message: str) -> None:
        now = time.monotonic()
        self._unreported += 1
        if self._last is not None and now - self._last < REPORT_EVERY_S:
            return
        count, self._unreported, self._last = self._unreported, 0, now
        more = f" ({count} refusals since the last report)" if count > 1 else ""
        self._log.log(self._level, "%s%s", message, more)
