"""The typed Python client of gpualloc: what the Slurm and Kueue bridges and the load tests use.

    from services.client import AllocatorClient, claim_from_spec

    with AllocatorClient("127.0.0.1:50051", owner="team-a/job-7") as client:
        with client.lease([claim_from_spec("4 x H100 nvlink", name="job-7")]) as lease:
            run(lease.placement)

Model values in (services.common.dra.model ResourceClaims), small frozen results out
(results.py), typed errors (services.common.errors, plus `Unplaceable`) instead of grpc ones.
"""

from services.client.client import AllocatorClient, Gang, Policy
from services.client.config import (
    DEFAULT_TARGET,
    NO_RETRY,
    ClientSettings,
    RetryPolicy,
    TlsConfig,
)
from services.client.errors import Unplaceable
from services.client.inventory import InventoryClient, InventoryDevice, NodeInventory
from services.client.lease import Lease
from services.client.results import (
    Capacity,
    ClaimAllocation,
    Explanation,
    Holder,
    NodeMiss,
    NodePlacement,
    Outcome,
    Placement,
    Reservation,
    ReservationState,
)
from services.client.specs import DeviceChoice, RequestSpec, build_claim, claim_from_spec

__all__ = [
    "DEFAULT_TARGET",
    "NO_RETRY",
    "AllocatorClient",
    "Capacity",
    "ClaimAllocation",
    "ClientSettings",
    "DeviceChoice",
    "Explanation",
    "Gang",
    "Holder",
    "InventoryClient",
    "InventoryDevice",
    "Lease",
    "NodeInventory",
    "NodeMiss",
    "NodePlacement",
    "Outcome",
    "Placement",
    "Policy",
    "RequestSpec",
    "Reservation",
    "ReservationState",
    "RetryPolicy",
    "TlsConfig",
    "Unplaceable",
    "build_claim",
    "claim_from_spec",
]
