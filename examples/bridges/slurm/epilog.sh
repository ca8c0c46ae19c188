#!/bin/sh
# slurm.conf: Epilog=/etc/slurm/gpualloc/epilog.sh — slurmd's node epilog, on each of the
# job's nodes (as SlurmdUser, root) when the job ends there: releases the job's GPUs of this
# node. Use it in place of EpilogSlurmctld when throughput counts: Slurm 22.05 schedules the
# GPUs a job leaves at once when its nodes' epilogs complete, but only at the next periodic
# pass when an EpilogSlurmctld (any, even `exit 0`) is configured (docs/bridges.md, "What it
# costs"). Through `gpualloc-slurm hooks --socket` (sync's on the controller) it returns at
# once and the release follows. Slurm drains a node whose Epilog fails, so this one never
# fails: a release that could not be made is done by sync's sweep or by the lease.
# Slurm runs it without PATH: name everything in full.
GPUALLOC_ALLOCATOR_ADDR=${GPUALLOC_ALLOCATOR_ADDR:-gpualloc.example.com:50051}
SLURM_CONF=${SLURM_CONF:-/etc/slurm/slurm.conf}
GPUALLOC_SLURM_SOCKET=${GPUALLOC_SLURM_SOCKET:-/run/gpualloc-slurm.sock}
GPUALLOC_SLURM_CLI=/opt/gpualloc/bin/gpualloc-slurm
export GPUALLOC_ALLOCATOR_ADDR SLURM_CONF GPUALLOC_SLURM_SOCKET GPUALLOC_SLURM_CLI
[ "${SLURM_JOB_NAME-}:${SLURM_JOB_UID-}" = "gpualloc-held:0" ] && exit 0
/usr/bin/python3 -I -S /etc/slurm/gpualloc/gpualloc-hook.py epilog --ignore-errors
exit 0
