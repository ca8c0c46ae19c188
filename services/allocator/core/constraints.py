"""Claim constraints checked incrementally: every successful `add` is paired with one `remove`.

matchAttribute (upstream `matchAttributeConstraint`): all devices in scope share one value of the
attribute; a device lacking it never satisfies the constraint, not even as the first device.
distinctAttribute: all devices in scope have the attribute and no two values are equal. We
compare values (Kubernetes 1.35's fix); 1.34 compared pointers, see docs/dra-compatibility.md.
Values are equal when type and value are equal (a version is compared as its exact string).
"""

from __future__ import annotations

from services.allocator.core.explain import ConstraintProblem
from services.allocator.core.plan import ConstraintKind, ConstraintSpec
from services.common.dra.model import AttributeValue, Device

__all__ = ["ConstraintState", "lookup_attribute", "show_value"]


def lookup_attribute(device: Device, driver: str, name: str) -> AttributeValue | None:
    """Upstream `lookupAttribute`: the full name, else the bare id when the domain is the driver."""
    found = device.attributes.get(name)
    if found is not None:
        return found
    domain, slash, ident = name.partition("/")
    if not slash or domain != driver:
        return None
    return device.attributes.get(ident)


class ConstraintState:
    """The values held by the devices picked so far for one constraint of one claim."""

    __slots__ = ("_counts", "_match", "spec")

    def __init__(self, spec: ConstraintSpec) -> None:
        self.spec = spec
        self._match: AttributeValue | None = None
        self._counts: dict[AttributeValue, int] = {}

    def problem(
        self, device: Device, driver: str
    ) -> tuple[ConstraintProblem, tuple[str, ...]] | None:
        """None if the device can be added; else why not, with the values involved (the
        device's first, then those of the devices already in the set)."""
        value = lookup_attribute(device, driver, self.spec.attribute)
        if value is None:
            return ConstraintProblem.MISSING, ()
        if self.spec.kind is ConstraintKind.MATCH:
            if self._match is not None and value != self._match:
                return ConstraintProblem.DIFFERS, (show_value(value), show_value(self._match))
        elif value in self._counts:
            return ConstraintProblem.REPEATS, (show_value(value),)
        return None

    def add(self, device: Device, driver: str) -> None:
        value = lookup_attribute(device, driver, self.spec.attribute)
        assert value is not None
        if self.spec.kind is ConstraintKind.MATCH and not self._counts:
            self._match = value
        self._counts[value] = self._counts.get(value, 0) + 1

    def remove(self, device: Device, driver: str) -> None:
        value = lookup_attribute(device, driver, self.spec.attribute)
        assert value is not None
        left = self._counts[value] - 1
        if left:
            self._counts[value] = left
        else:
            del self._counts[value]
            if not self._counts:
                self._match = None


def show_value(value: AttributeValue) -> str:
    """How explanations print an attribute value: strings quoted, bools lower case."""
    if value.type == "string":
        return f'"{value.value}"'
    if value.type == "bool":
        return "true" if value.value else "false"
    return str(value.value)
