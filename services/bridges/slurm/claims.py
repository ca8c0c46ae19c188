"""A Slurm job's per-node GPU request -> the DRA claim gpualloc allocates on that node.

One claim per node, named `slurm-job-<id>`, in namespace `slurm`. Two kinds:

- `pinned_claim`: the devices Slurm itself picked (its GPU ids, mapped through the node's
  gres.conf lines to inventory devices): one request per device class whose selector names
  the devices by UUID, so gpualloc reserves exactly Slurm's choice or nothing.
- `claim_for_node`: a request without Slurm's ids (sbatch-style flags, `translate`): one
  request per GRES entry (`gpu-0`, `gpu-1`, ... or `gpus` when there is one): an untyped entry
  is any whole GPU (class gpu.nvidia.com), a typed one a whole GPU of exactly that GRES type, a
  MIG type (`a100_3g.20gb`) a MIG device of that profile on that model (class mig.nvidia.com).

NVLink adds the gpualloc topology annotation over all whole GPUs of the claim.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from services.bridges.slurm.request import GpuGres, SlurmGpuRequest
from services.client.inventory import InventoryDevice
from services.client.specs import (
    DRIVER,
    GPU_CLASS,
    MIG_CLASS,
    DeviceChoice,
    RequestSpec,
    build_claim,
)
from services.common.dra.model import (
    DeviceRequest,
    DeviceSelector,
    ExactDeviceRequest,
    ResourceClaim,
)
from services.common.errors import InvalidArgument

__all__ = ["NAMESPACE", "claim_for_node", "claim_name", "pinned_claim", "uuid_selector"]

NAMESPACE = "slurm"


def claim_name(job_id: str) -> str:
    return f"slurm-job-{job_id}"


def _choice(gres: GpuGres) -> DeviceChoice:
    if gres.mig_profile is not None:
        return DeviceChoice(mig_profile=gres.mig_profile, model=gres.model, exact_model=True)
    return DeviceChoice(model=gres.model, exact_model=True)


def claim_for_node(job_id: str, request: SlurmGpuRequest) -> ResourceClaim:
    """The claim of one node of the job; InvalidArgument when the job asks for no GPU."""
    if not request.per_node:
        raise InvalidArgument.at("gres", f"job {job_id} requests no GPU")
    single = len(request.per_node) == 1
    specs = [
        RequestSpec("gpus" if single else f"gpu-{i}", gres.count, (_choice(gres),))
        for i, gres in enumerate(request.per_node)
    ]
    return build_claim(claim_name(job_id), specs, namespace=NAMESPACE, nvlink=request.nvlink)


def uuid_selector(uuids: Sequence[str]) -> str:
    """CEL: the device is one of these (by its `uuid` attribute)."""
    listed = ", ".join("'" + u.replace("\\", "\\\\").replace("'", "\\'") + "'" for u in uuids)
    return f"device.attributes['{DRIVER}'].uuid in [{listed}]"


def pinned_claim(
    job_id: str, devices: Sequence[InventoryDevice], *, nvlink: bool = False
) -> ResourceClaim:
    """The claim of exactly `devices` (each with a UUID): what Slurm picked on one node."""
    if not devices:
        raise InvalidArgument.at("gres", f"job {job_id}: no device to pin")
    by_class: dict[str, list[str]] = {}
    for device in devices:
        if device.uuid is None:
            raise InvalidArgument.at("gres", f"{device.id} has no UUID to pin it by")
        by_class.setdefault(MIG_CLASS if device.type == "mig" else GPU_CLASS, []).append(
            device.uuid
        )
    base = build_claim(
        claim_name(job_id),
        [RequestSpec("gpus", len(devices))],
        namespace=NAMESPACE,
        nvlink=nvlink and MIG_CLASS not in by_class,
    )
    single = len(by_class) == 1
    requests = tuple(
        DeviceRequest(
            "gpus" if single else ("gpu" if cls == GPU_CLASS else "mig"),
            exactly=ExactDeviceRequest(
                device_class_name=cls,
                selectors=(DeviceSelector(uuid_selector(uuids)),),
                count=len(uuids),
            ),
        )
        for cls, uuids in sorted(by_class.items())
    )
    return replace(base, requests=requests)
