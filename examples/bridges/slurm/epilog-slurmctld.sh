#!/bin/sh
# slurm.conf: EpilogSlurmctld=/etc/slurm/gpualloc/epilog-slurmctld.sh — runs on the controller
# (as SlurmUser) when the job ends (completed, failed, cancelled, requeued). Releases the job's
# GPUs in gpualloc on every node (idempotent). A failing EpilogSlurmctld drains nothing; if
# gpualloc cannot be told, the reservation stays held (see docs/bridges.md, "gpualloc down").
GPUALLOC_ALLOCATOR_ADDR=${GPUALLOC_ALLOCATOR_ADDR:-gpualloc.example.com:50051}
export GPUALLOC_ALLOCATOR_ADDR
exec /opt/gpualloc/bin/gpualloc-slurm epilog --all-nodes
