"""The DRA object model (resource.k8s.io/v1, Kubernetes 1.34) shared by both services.

Modules, each pure (no I/O except `parse.read_text`):

- `model`     frozen dataclasses: ResourceSlice, Device, DeviceClass, ResourceClaim, ...
- `quantity`  Kubernetes resource.Quantity with upstream grammar, arithmetic and strings
- `names`     the API's name formats (DNS labels/subdomains, qualified names, semver)
- `validate`  the API's validation rules, reported as field violations
- `parse`     YAML/JSON text as kubectl prints it -> validated model objects
- `serialize` model objects -> Kubernetes-shaped dicts (the inverse of `parse`)

The most used entry points are re-exported here.
"""

from services.common.dra.parse import KubeObject, decode_object, load_files, load_objects
from services.common.dra.quantity import Quantity, QuantityFormat
from services.common.dra.serialize import to_dict
from services.common.dra.validate import (
    validate_allocation_result,
    validate_device_class,
    validate_resource_claim,
    validate_resource_slice,
)

__all__ = [
    "KubeObject",
    "Quantity",
    "QuantityFormat",
    "decode_object",
    "load_files",
    "load_objects",
    "to_dict",
    "validate_allocation_result",
    "validate_device_class",
    "validate_resource_claim",
    "validate_resource_slice",
]
