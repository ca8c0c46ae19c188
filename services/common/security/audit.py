"""The audit trail: one structured log event per grant, change, expiry, inventory write, denial.

Events go to the `gpualloc.audit` logger at INFO, so with `GPUALLOC_LOG_FORMAT=json` each is
one JSON object per line that a log pipeline can route apart (`"logger": "gpualloc.audit"`):

    {"ts": "...", "level": "INFO", "logger": "gpualloc.audit", "msg": "reservation.grant",
     "event": "reservation.grant", "identity": "spiffe://fleet/ns/slurm/sa/bridge",
     "tenant": "hpc", "method": "Allocate", "reservation": "res-…@node-1", "owner":
     "hpc/slurm/job/42", "node": "node-1", "devices": ["gpu.nvidia.com/node-1/gpu-0"],
     "trace_id": "…"}

Event names: reservation.grant / .commit / .renew / .release / .expire, inventory.apply /
.delete / .report, call.denied (with `code` UNAUTHENTICATED or PERMISSION_DENIED and `reason`;
`item`, its index, for an AllocateBatch or AllocateStream item denied on its own).
The identity is the principal's and `tenant` the tenant the call acts in; a call acting for a
tenant other than its identity's own (a binding's actForTenants) adds `acts_for_tenant: true`
and `identity_tenant` (the identity's own, "" when it has none). The identity is `system` for
what the server does by itself (lease expiries);
`unauthenticated` for a denied caller no principal was made for (no certificate or token, one
that did not verify, or one no binding names), with `presented`: what it showed — the
certificate's names, or the token's unverified issuer and subject (never the token).
Every event of a call carries the call's trace id (the active span's, else the caller's W3C
`traceparent`, else one made for the call) — the id in the server's other logs and traces.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Any

from services.common.security.principal import Principal

__all__ = [
    "AUDIT_LOGGER",
    "SYSTEM_IDENTITY",
    "UNAUTHENTICATED_IDENTITY",
    "audit_enabled",
    "audit_event",
]

AUDIT_LOGGER = "gpualloc.audit"
SYSTEM_IDENTITY = "system"  # the server itself (lease expiries)
UNAUTHENTICATED_IDENTITY = "unauthenticated"  # a denied caller without a principal

_log = logging.getLogger(AUDIT_LOGGER)


def audit_enabled() -> bool:
    """Whether audit events are logged (`gpualloc.audit` at INFO): a caller with many events to
    build (a batch's grants) builds none when they are not."""
    return _log.isEnabledFor(logging.INFO)


def audit_event(
    event: str,
    principal: Principal | None,
    *,
    trace_id: str = "",
    devices: Iterable[str] = (),
    presented: str | None = None,
    **fields: Any,
) -> None:
    """Log one audit event; `fields` (reservation, owner, node, method, ...) go in as given,
    empty ones left out. `principal` None means the server itself (lease expiry), or, with
    `presented` (what a denied caller showed), a caller that has none."""
    if not _log.isEnabledFor(logging.INFO):  # audit logging off: nothing to build
        return
    if principal is not None:
        identity = principal.name
    else:
        identity = SYSTEM_IDENTITY if presented is None else UNAUTHENTICATED_IDENTITY
    record: dict[str, Any] = {
        "event": event,
        "identity": identity,
        "tenant": (principal.tenant if principal is not None else None) or "",
    }
    if principal is None and presented is not None:
        record["presented"] = presented
    if principal is not None and principal.development:
        record["auth"] = "development"
    if principal is not None and principal.acts_for_tenant:  # the identity's own, beside it
        record["acts_for_tenant"] = True
        record["identity_tenant"] = principal.identity_tenant or ""
    listed = sorted(devices)
    if listed:
        record["devices"] = listed
    record.update({key: value for key, value in fields.items() if value not in ("", None)})
    if trace_id:
        record["trace_id"] = trace_id
    _log.info(event, extra=record)
