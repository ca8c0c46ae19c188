"""DRA model <-> `gpualloc.common.v1` protobuf messages, in both directions.

The public face of services.common.pb (the code lives in _base, _slices and _claims). Servicers
call `from_pb_*` on what clients send and `to_pb_*` on what they answer.

`to_pb_*` never fails on a model value. `from_pb_*` reads client input, so it raises
`InvalidArgument` naming the proto field path of the first value it cannot convert, e.g.
`claims[0].requests[1].exactly.count` or `slices[2].devices[0].attributes["productName"]`.
Each `from_pb_*` takes the path of the message it converts (empty at the top level, so pass
`f"claims[{i}]"` for a request's i-th claim) and extends it for nested fields.

Checked here is only what conversion needs: an empty oneof, a missing required message or
name, an unparsable quantity, an unknown or unset required enum, a negative count. The API's
limits (name lengths, 128 devices per slice, ...) are validation, done on the model.

Defaults are applied as Kubernetes applies them: an empty namespace is `default`, a count of
0 is 1, an unset allocation mode is ExactCount, an unset toleration operator is Equal, an empty
api_version is `resource.k8s.io/v1`. Quantities travel as canonical strings (`80Gi`). Opaque
parameters travel as google.protobuf.Struct, whose numbers are doubles: integral numbers come
back as ints, as they would from JSON. Maps come back with sorted keys.
"""

from __future__ import annotations

from services.common.pb._base import (
    field_path,
    from_pb_device_id,
    from_pb_node,
    from_pb_node_selector,
    from_pb_opaque_configuration,
    from_pb_quantity,
    to_pb_device_id,
    to_pb_node,
    to_pb_node_selector,
    to_pb_opaque_configuration,
    to_pb_quantity,
)
from services.common.pb._claims import (
    allocation_result_bytes,
    fill_pb_allocation_result,
    from_pb_allocation_result,
    from_pb_device_request,
    from_pb_device_toleration,
    from_pb_resource_claim,
    has_extras,
    node_selector_field,
    one_device_allocation_bytes,
    one_device_allocation_pieces,
    to_pb_allocation_result,
    to_pb_device_request,
    to_pb_device_toleration,
    to_pb_resource_claim,
)
from services.common.pb._slices import (
    from_pb_device,
    from_pb_device_attribute,
    from_pb_device_class,
    from_pb_device_taint,
    from_pb_resource_slice,
    to_pb_device,
    to_pb_device_attribute,
    to_pb_device_class,
    to_pb_device_taint,
    to_pb_resource_slice,
)

__all__ = [
    "allocation_result_bytes",
    "field_path",
    "fill_pb_allocation_result",
    "from_pb_allocation_result",
    "from_pb_device",
    "from_pb_device_attribute",
    "from_pb_device_class",
    "from_pb_device_id",
    "from_pb_device_request",
    "from_pb_device_taint",
    "from_pb_device_toleration",
    "from_pb_node",
    "from_pb_node_selector",
    "from_pb_opaque_configuration",
    "from_pb_quantity",
    "from_pb_resource_claim",
    "from_pb_resource_slice",
    "has_extras",
    "node_selector_field",
    "one_device_allocation_bytes",
    "one_device_allocation_pieces",
    "to_pb_allocation_result",
    "to_pb_device",
    "to_pb_device_attribute",
    "to_pb_device_class",
    "to_pb_device_id",
    "to_pb_device_request",
    "to_pb_device_taint",
    "to_pb_device_toleration",
    "to_pb_node",
    "to_pb_node_selector",
    "to_pb_opaque_configuration",
    "to_pb_quantity",
    "to_pb_resource_claim",
    "to_pb_resource_slice",
]
