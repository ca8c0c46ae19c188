#!/bin/sh
# slurm.conf: EpilogSlurmctld=/etc/slurm/gpualloc/epilog-slurmctld.sh — runs on the controller
# (as SlurmUser) when the job ends (completed, failed, cancelled, requeued). Releases the job's
# GPUs in gpualloc on every node (idempotent), then (--sweep) those of this cluster's jobs that
# ended while gpualloc was unreachable. A failing EpilogSlurmctld drains nothing: if gpualloc
# cannot be told, the reservation stays held until the next EpilogSlurmctld or
# `gpualloc-slurm sync` pass that reaches it, or until its lease (GPUALLOC_SLURM_LEASE) expires.
# Slurm runs it without PATH: name everything in full.
GPUALLOC_ALLOCATOR_ADDR=${GPUALLOC_ALLOCATOR_ADDR:-gpualloc.example.com:50051}
SLURM_CONF=${SLURM_CONF:-/etc/slurm/slurm.conf}
export GPUALLOC_ALLOCATOR_ADDR SLURM_CONF
# gpualloc-slurm sync's holder jobs (named gpualloc-held, submitted by root) need nothing
# here; skipping them in the shell spares the controller a Python start per holder.
[ "${SLURM_JOB_NAME-}:${SLURM_JOB_UID-}" = "gpualloc-held:0" ] && exit 0
exec /opt/gpualloc/bin/gpualloc-slurm epilog --all-nodes --sweep
