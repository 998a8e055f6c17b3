"""One log line for every 4xx the gateway makes itself, so an operator sees why a client was refused.

Before this, a body kvgate refused (Claude Code's mid-conversation system turn, issue 21) left no trace: the
client exited and the gateway's log was silent. The line names the path, the status, the error's stable reason
(its code or type), and the tenant when it is known by then; never the message (it may quote the body) or any
prompt text. Errors relayed from a replica are not the gateway's and are not logged here.
"""

from __future__ import annotations

import logging

log = logging.getLogger("kvgate.rejected")


def log_rejection(path: str, status: int, reason: str | None, tenant: str | None) -> None:
    """`rejected path=… status=… error=… tenant=…` for a gateway-made 4xx (5xx are logged where they are made).

    WARNING, so the default log level shows it; a 429 at INFO: a limit doing its job under load is counted in
    the metrics already and would flood the log.
    """
    if 400 <= status < 500:
        level = logging.INFO if status == 429 else logging.WARNING
        log.log(level, "rejected path=%s status=%d error=%s tenant=%s", path, status, reason or "-", tenant or "-")
