"""A fabric of composable GPUs with DRA binding conditions, the manifest the binding tests serve
(docs/reservations.md, "Binding"): one ResourceSlice of network-attached GPUs behind a node
selector (`fabric: a`), each `bindsToNode` with one binding condition and one failure
condition, and the one Node on that fabric."""

from __future__ import annotations

__all__ = ["ATTACHED", "FABRIC_NODE", "FAILED", "fabric_manifest"]

ATTACHED, FAILED = "dra.example.com/attached", "dra.example.com/attach-failed"
FABRIC_NODE = "composable-1"


def fabric_manifest(devices: int = 1, *, product: str = "") -> str:
    """The slice (driver gpu.nvidia.com, pool `fabric`, devices gpu-0, gpu-1, ...) and its
    Node, as one YAML stream. `product`: each device has attributes `type: gpu` and that
    `productName`."""
    attributes = (
        f"    attributes:\n      type: {{string: gpu}}\n      productName: {{string: {product}}}\n"
        if product
        else ""
    )
    listed = "".join(
        f"  - name: gpu-{i}\n    bindsToNode: true\n    bindingConditions: [{ATTACHED}]\n"
        f"    bindingFailureConditions: [{FAILED}]\n{attributes}"
        for i in range(devices)
    )
    return (
        "apiVersion: resource.k8s.io/v1\nkind: ResourceSlice\nmetadata: {name: fabric}\nspec:\n"
        "  driver: gpu.nvidia.com\n"
        "  pool: {name: fabric, generation: 1, resourceSliceCount: 1}\n"
        "  nodeSelector:\n"
        "    nodeSelectorTerms:\n"
        '    - matchExpressions: [{key: fabric, operator: In, values: ["a"]}]\n'
        "  devices:\n" + listed + "---\n"
        f"apiVersion: v1\nkind: Node\nmetadata: {{name: {FABRIC_NODE}, labels: {{fabric: a}}}}\n"
    )
