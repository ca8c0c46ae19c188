"""A Slurm job's per-node GPU request -> the DRA claim gpualloc allocates on that node.

One claim per node, named `slurm-job-<id>`, in namespace `slurm`; one request per GRES entry
(`gpu-0`, `gpu-1`, ... or `gpus` when there is one): an untyped entry is any whole GPU
(class gpu.nvidia.com), a typed one a whole GPU of that model, a MIG type (`a100_3g.20gb`) a
MIG device of that profile on that model (class mig.nvidia.com). NVLink adds the gpualloc
topology annotation over all whole GPUs of the claim.
"""

from __future__ import annotations

from services.bridges.slurm.request import GpuGres, SlurmGpuRequest
from services.client.specs import DeviceChoice, RequestSpec, build_claim
from services.common.dra.model import ResourceClaim
from services.common.errors import InvalidArgument

__all__ = ["NAMESPACE", "claim_name", "claim_for_node"]

NAMESPACE = "slurm"


def claim_name(job_id: str) -> str:
    return f"slurm-job-{job_id}"


def _choice(gres: GpuGres) -> DeviceChoice:
    if gres.mig_profile is not None:
        return DeviceChoice(mig_profile=gres.mig_profile, model=gres.model)
    return DeviceChoice(model=gres.model)


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
