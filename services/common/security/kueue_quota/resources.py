"""How a Kueue resource name counts in gpualloc: which devices (DeviceClasses, a counter, GPU
shares, CEL selectors) a ClusterQueue's covered resource stands for, from spec.quota.kueue's
`resources`, the Configuration's deviceClassMappings or the built-ins (nvidia.com/gpu,
nvidia.com/mig-<profile>); or that gpualloc does not allocate it (not enforced); or a refusal."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from services.common.security.kueue_quota.fields import Checker, FieldError

# How a Kueue resource name counts when neither spec.quota.kueue.resources nor the
# Configuration's deviceClassMappings name it: the NVIDIA device plugin's whole GPUs, as the
# Kueue bridge asks for them (services/bridges/kueue/translate.py: class gpu.nvidia.com).
BUILT_IN_RESOURCES: Mapping[str, Mapping[str, Any]] = {
    "nvidia.com/gpu": {"deviceClassNames": ["gpu.nvidia.com"]},
}
# Resources of a Pod that gpualloc does not allocate: accepted in a ClusterQueue and listed as
# not enforced (Kueue still enforces them on its own Workloads).
NOT_ALLOCATED = ("cpu", "memory", "ephemeral-storage", "pods", "storage")
_NOT_ALLOCATED_PREFIXES = ("hugepages-",)
_MIG_PREFIX = "nvidia.com/mig-"
# NVIDIA's MIG profile names (1g.10gb, 1c.3g.71gb, 1g.10gb-me), as services/client/specs.py has
_MIG_PROFILE = re.compile(r"\d+(c\.\d+)?g\.\d+gb(\+me(\.all)?|\+gfx|-me)?")
_MIG_CLASS = "mig.nvidia.com"  # the NVIDIA DRA driver's class of MIG devices


def mig_profile_resource(name: str) -> Mapping[str, Any] | None:
    """How the device plugin's `nvidia.com/mig-<profile>` (the GPU Operator's mixed MIG
    strategy) counts: each device of class mig.nvidia.com of that profile counts 1, what the
    Kueue bridge allocates for it (services/bridges/kueue/translate.py); None for another name."""
    profile = name.removeprefix(_MIG_PREFIX)
    if not name.startswith(_MIG_PREFIX) or not _MIG_PROFILE.fullmatch(profile):
        return None
    expression = f"device.attributes['gpu.nvidia.com'].profile == '{profile}'"
    return {"deviceClassNames": [_MIG_CLASS], "selectors": [{"cel": {"expression": expression}}]}


def explicit_resources(top: Checker, value: object) -> dict[str, dict[str, Any]]:
    """spec.quota.kueue.resources: a Kueue resource name and how it counts (native fields)."""
    mapped: dict[str, dict[str, Any]] = {}
    for i, item in enumerate(top.sequence(value, "resources")):
        path = f"resources[{i}]"
        fields = top.mapping(
            item, path, {"name", "deviceClassNames", "counter", "gpuShare", "selectors"}
        )
        name = top.resource_name(fields.get("name"), f"{path}.name")
        if name in mapped:
            top.fail(FieldError.DUPLICATE, f"{path}.name", name)
        classes = top.sequence(fields.get("deviceClassNames"), f"{path}.deviceClassNames")
        if not classes:
            top.fail(FieldError.REQUIRED, f"{path}.deviceClassNames", "at least one DeviceClass")
        native: dict[str, Any] = {
            "deviceClassNames": [
                top.string(c, f"{path}.deviceClassNames[{j}]") for j, c in enumerate(classes)
            ]
        }
        if "counter" in fields:
            native["counter"] = top.string(fields["counter"], f"{path}.counter")
        if "gpuShare" in fields:
            if not isinstance(fields["gpuShare"], bool):
                top.fail(FieldError.INVALID, f"{path}.gpuShare", "must be true or false")
            native["gpuShare"] = fields["gpuShare"] is True
        if "selectors" in fields:  # a DeviceClass's shape, checked by the native parser
            native["selectors"] = fields["selectors"]
        if native.get("counter") and native.get("gpuShare"):
            top.fail(FieldError.INVALID, f"{path}.gpuShare", "counts a counter or GPU shares")
        if name:
            mapped[name] = native
    return mapped


@dataclass
class Resources:
    """How each Kueue resource name counts in gpualloc, in this order: spec.quota.kueue's
    `resources`, the Configuration's deviceClassMappings, the built-ins; or it is not
    allocated by gpualloc (not enforced); or it is refused."""

    explicit: Mapping[str, Mapping[str, Any]]
    mappings: Mapping[str, Mapping[str, Any]]
    not_enforced: set[str]
    top: Checker

    def __post_init__(self) -> None:
        for name in sorted(set(self.explicit) & set(self.mappings)):
            self.top.fail(
                FieldError.DUPLICATE,
                "resources",
                f"{name} is also a deviceClassMappings name of the Configuration",
            )
        for name in sorted(self.not_enforced & (set(self.explicit) | set(self.mappings))):
            self.top.fail(FieldError.INVALID, "notEnforced", f"{name} is mapped to devices")

    def counted(self, name: str) -> Mapping[str, Any] | None:
        """The native fields (deviceClassNames, counter, gpuShare, selectors) `name` counts by;
        None when it counts no device (`refusal` says whether that is allowed)."""
        for table in (self.explicit, self.mappings, BUILT_IN_RESOURCES):
            if name in table:
                return table[name]
        return mig_profile_resource(name)

    def refusal(self, name: str) -> str | None:
        """Why a covered resource is refused; None when it counts or is not enforced."""
        if self.counted(name) is not None:
            return None
        if name in self.not_enforced or name in NOT_ALLOCATED:
            return None
        if name.startswith(_NOT_ALLOCATED_PREFIXES):
            return None
        if name.startswith(_MIG_PREFIX):
            return (
                f"{name}: not a MIG profile (NVIDIA's mixed strategy names them "
                "nvidia.com/mig-<profile>, e.g. nvidia.com/mig-1g.10gb)"
            )
        return (
            f"gpualloc allocates no resource {name}: map it to DeviceClasses "
            "(spec.quota.kueue.resources, or the Configuration's deviceClassMappings) or list "
            "it in spec.quota.kueue.notEnforced"
        )
