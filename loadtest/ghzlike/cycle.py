"""gpualloc's reserve/release cycle, which ghz cannot express (it calls one method per run).

With `--cycle release` one unit of load is: the configured call (Allocate with `reserve: true`,
or an AllocateBatch of such items), then `Release` of every reservation its reply holds, by the
reservation's owner and fencing token. The latency and status recorded are the cycle's: both
calls, the first failure. Without the cycle (ghz, or the runner without the flag) reservations
are left to their `leaseTtl`, which is why the reserve configs ask for a short lease.
"""

from __future__ import annotations

from typing import Any

import grpc

from loadtest.ghzlike.config import ConfigError, LoadConfig
from loadtest.ghzlike.engine import Invoke
from loadtest.ghzlike.method import Method, RequestSource, resolve_method

__all__ = ["CYCLES", "release_cycle"]

_RELEASE = "Release"


def release_cycle(
    config: LoadConfig, method: Method, channel: grpc.Channel, requests: RequestSource
) -> Invoke:
    """Call, then release what the reply reserved (same service's `Release`)."""
    fields = method.response_class.DESCRIPTOR.fields_by_name
    if "reservations" not in fields and "items" not in fields:
        raise ConfigError(f"--cycle release: {config.call} replies hold no `reservations`")
    service = method.descriptor.containing_service.full_name
    release = resolve_method(channel, f"{service}/{_RELEASE}", config.reflect_metadata)
    call = method.callable(channel)
    release_call = release.callable(channel)
    timeout = config.timeout or None

    def invoke(request_number: int, worker_id: str) -> None:
        metadata = requests.metadata(request_number, worker_id)
        reply: Any = call(
            requests.request(request_number, worker_id), timeout=timeout, metadata=metadata
        )
        for reservation in _reservations(reply):
            release_call(
                release.request_class(
                    reservation_id=reservation.id,
                    owner=reservation.owner,
                    fencing_token=reservation.fencing_token,
                ),
                timeout=timeout,
                metadata=metadata,
            )

    return invoke


def _reservations(reply: Any) -> list[Any]:
    """What a reply holds: an Allocate's `reservations`, or those of every answered item of an
    AllocateBatch (`items[].response.reservations`)."""
    if "items" not in reply.DESCRIPTOR.fields_by_name:
        return list(reply.reservations)
    return [
        reservation
        for item in reply.items
        if item.HasField("response")
        for reservation in item.response.reservations
    ]


CYCLES = {"release": release_cycle}
