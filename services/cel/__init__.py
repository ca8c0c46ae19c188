"""The CEL engine for DRA selectors (Kubernetes' CEL library): compile, cost, evaluate.

Its door is this package: import from services.cel only. It imports nothing of
gpualloc's but services.common; pure (no grpc, redis, protobuf, clock, environment).
"""

from services.cel.selectors import (
    DEFAULT_REQUEST_COST,
    CelBudgetExhausted,
    CelDevice,
    CelError,
    CelMeter,
    CompiledSelector,
    SelectorCache,
)

__all__ = [
    "CelBudgetExhausted",
    "CelDevice",
    "CelError",
    "CelMeter",
    "CompiledSelector",
    "DEFAULT_REQUEST_COST",
    "SelectorCache",
]
