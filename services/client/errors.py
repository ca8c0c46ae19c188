"""The one error the client adds to services.common.errors: claims that do not fit.

Allocate answers "does not fit" as a normal response (never an RPC error). Code that needs the
devices to proceed — `client.lease()`, the bridges' prologs — turns that answer into
`Unplaceable`, which carries the placement (explanation and holders included).
"""

from __future__ import annotations

from services.client.results import Placement
from services.common.errors import GpuallocError

__all__ = ["Unplaceable"]


class Unplaceable(GpuallocError):
    """The claims do not fit now; `placement.reason()` says why and who holds what."""

    def __init__(self, placement: Placement, what: str = "the claims") -> None:
        super().__init__(f"{what} cannot be placed:\n{placement.reason()}")
        self.placement = placement
