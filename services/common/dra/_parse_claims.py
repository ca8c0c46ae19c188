"""Decoders for the claim side: DeviceClass, ResourceClaim (spec.devices and
status.allocation) and ResourceClaimTemplate (its spec.spec, as the claim it stamps out).

Each object decoder returns the object and its violations (metadata plus validate.py's rules);
shape errors raise `Invalid`. Private to `services.common.dra`; `parse` is the face.
"""

from __future__ import annotations

from services.common.dra import validate
from services.common.dra._parse_fields import Fields, Invalid, metadata_name
from services.common.dra._parse_slices import decode_node_selector
from services.common.dra.model import (
    AllocationMode,
    AllocationResult,
    CapacityRequirements,
    ConfigSource,
    DeviceAllocationConfiguration,
    DeviceClaimConfiguration,
    DeviceClass,
    DeviceConstraint,
    DeviceRequest,
    DeviceRequestAllocationResult,
    DeviceSelector,
    DeviceSubRequest,
    DeviceToleration,
    ExactDeviceRequest,
    OpaqueDeviceConfiguration,
    ResourceClaim,
    TaintEffect,
    TolerationOperator,
)
from services.common.errors import FieldViolation

__all__ = [
    "decode_allocation",
    "decode_device_class",
    "decode_resource_claim",
    "decode_resource_claim_template",
]


def decode_device_class(f: Fields) -> tuple[DeviceClass, list[FieldViolation]]:
    metadata, spec = (
        f.obj("metadata") or Fields({}, "metadata"),
        f.obj("spec") or Fields({}, "spec"),
    )
    violations: list[FieldViolation] = []
    name = metadata_name(metadata, violations)
    device_class = DeviceClass(
        name=name,
        selectors=_selectors(spec),
        config=tuple(_opaque(c.required_obj("opaque")) for c in spec.objs("config")),
        labels=metadata.str_map("labels"),
    )
    return device_class, violations + validate.device_class_violations(device_class)


def _selectors(f: Fields) -> tuple[DeviceSelector, ...]:
    return tuple(
        DeviceSelector(s.required_obj("cel").str_("expression")) for s in f.objs("selectors")
    )


def _opaque(f: Fields) -> OpaqueDeviceConfiguration:
    parameters = f.data.get("parameters")
    if parameters is not None and not isinstance(parameters, dict):
        raise Invalid(
            f.at("parameters"),
            'Invalid value: "<value omitted>": parameters must be a valid JSON object',
        )
    return OpaqueDeviceConfiguration(f.str_("driver"), parameters or {})


def decode_resource_claim(f: Fields) -> tuple[ResourceClaim, list[FieldViolation]]:
    metadata = f.obj("metadata") or Fields({}, "metadata")
    violations: list[FieldViolation] = []
    name = metadata_name(metadata, violations)
    status = f.obj("status")
    allocation = status.obj("allocation") if status is not None else None
    spec = f.obj("spec") or Fields({}, "spec")
    allocated = None if allocation is None else decode_allocation(allocation)
    claim = _claim(metadata, name, spec, allocated)
    return claim, violations + validate.resource_claim_violations(claim)


def decode_resource_claim_template(f: Fields) -> tuple[ResourceClaim, list[FieldViolation]]:
    metadata = f.obj("metadata") or Fields({}, "metadata")
    violations: list[FieldViolation] = []
    name = metadata_name(metadata, violations)
    spec = f.required_obj("spec").obj("spec") or Fields({}, "spec.spec")
    claim = _claim(metadata, name, spec, None)
    return claim, violations + validate.resource_claim_violations(claim, path="spec.spec")


def _claim(
    metadata: Fields, name: str, spec: Fields, allocation: AllocationResult | None
) -> ResourceClaim:
    devices = spec.obj("devices") or Fields({}, spec.at("devices"))
    return ResourceClaim(
        name=name,
        namespace=metadata.str_("namespace", "default"),
        uid=metadata.str_("uid"),
        requests=tuple(_request(r) for r in devices.objs("requests")),
        constraints=tuple(
            DeviceConstraint(
                c.strs("requests"), c.opt_str("matchAttribute"), c.opt_str("distinctAttribute")
            )
            for c in devices.objs("constraints")
        ),
        config=tuple(
            DeviceClaimConfiguration(c.strs("requests"), _opaque(c.required_obj("opaque")))
            for c in devices.objs("config")
        ),
        allocation=allocation,
        labels=metadata.str_map("labels"),
        annotations=metadata.str_map("annotations"),
    )


def _request(f: Fields) -> DeviceRequest:
    exactly = f.obj("exactly")
    return DeviceRequest(
        name=f.str_("name"),
        exactly=None if exactly is None else _exact_request(exactly),
        first_available=tuple(_subrequest(s) for s in f.objs("firstAvailable")),
    )


def _mode_and_count(f: Fields) -> tuple[AllocationMode, int]:
    """API defaults: ExactCount with count 1. With All, count must be unset (0 counts as unset)."""
    mode = f.enum("allocationMode", AllocationMode, AllocationMode.EXACT_COUNT)
    count = f.int_("count", 0 if mode is AllocationMode.ALL else 1)
    if mode is AllocationMode.ALL:
        if count != 0:
            detail = "must not be specified when allocationMode is 'All'"
            raise Invalid(f.at("count"), f"Invalid value: {count}: {detail}")
        return mode, 1  # the model's default; the allocator ignores count for All
    return mode, count


def _exact_request(f: Fields) -> ExactDeviceRequest:
    mode, count = _mode_and_count(f)
    capacity = f.obj("capacity")
    return ExactDeviceRequest(
        device_class_name=f.str_("deviceClassName"),
        selectors=_selectors(f),
        allocation_mode=mode,
        count=count,
        admin_access=f.opt_bool("adminAccess"),
        tolerations=tuple(_toleration(t) for t in f.objs("tolerations")),
        capacity=None
        if capacity is None
        else CapacityRequirements(capacity.quantities("requests")),
    )


def _subrequest(f: Fields) -> DeviceSubRequest:
    mode, count = _mode_and_count(f)
    capacity = f.obj("capacity")
    return DeviceSubRequest(
        name=f.str_("name"),
        device_class_name=f.str_("deviceClassName"),
        selectors=_selectors(f),
        allocation_mode=mode,
        count=count,
        tolerations=tuple(_toleration(t) for t in f.objs("tolerations")),
        capacity=None
        if capacity is None
        else CapacityRequirements(capacity.quantities("requests")),
    )


def _toleration(f: Fields) -> DeviceToleration:
    effect = f.data.get("effect")
    return DeviceToleration(
        key=f.str_("key"),
        operator=f.enum("operator", TolerationOperator, TolerationOperator.EQUAL),
        value=f.str_("value"),
        effect=None if effect is None else f.enum("effect", TaintEffect),
        toleration_seconds=None
        if f.data.get("tolerationSeconds") is None
        else f.int_("tolerationSeconds", 0),
    )


def decode_allocation(f: Fields) -> AllocationResult:
    """As in ResourceClaim.status.allocation; validated by the caller, who knows the claim."""
    devices = f.obj("devices") or Fields({}, f.at("devices"))
    return AllocationResult(
        results=tuple(_allocated_device(r) for r in devices.objs("results")),
        config=tuple(
            DeviceAllocationConfiguration(
                c.enum("source", ConfigSource),
                c.strs("requests"),
                _opaque(c.required_obj("opaque")),
            )
            for c in devices.objs("config")
        ),
        node_selector=decode_node_selector(f.obj("nodeSelector")),
    )


def _allocated_device(f: Fields) -> DeviceRequestAllocationResult:
    return DeviceRequestAllocationResult(
        request=f.str_("request"),
        driver=f.str_("driver"),
        pool=f.str_("pool"),
        device=f.str_("device"),
        admin_access=f.opt_bool("adminAccess"),
        tolerations=tuple(_toleration(t) for t in f.objs("tolerations")),
        share_id=f.opt_str("shareID"),
        consumed_capacity=f.quantities("consumedCapacity"),
        binding_conditions=f.strs("bindingConditions"),
        binding_failure_conditions=f.strs("bindingFailureConditions"),
    )
