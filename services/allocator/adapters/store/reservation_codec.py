"""AllocationResult from the dict Kubernetes writes in a ResourceClaim's `status.allocation`.

The Redis store writes each reservation's allocations with the shared serializer
(`services.common.dra.serialize.allocation_result_to_dict`), so what sits in Redis reads like
`kubectl get resourceclaim -o json`. This is the way back, through the shared parser. The
allocations were validated when the allocator made them, and a reservation does not store the
claim their results would be checked against, so the parser checks their shape only.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from services.common.dra.model import AllocationResult
from services.common.dra.parse import allocation_result_from_dict

__all__ = ["allocation_from_dict"]


def allocation_from_dict(data: Mapping[str, Any]) -> AllocationResult:
    """The exact inverse of `allocation_result_to_dict`; InvalidArgument on a malformed one."""
    return allocation_result_from_dict(data, check=False)
