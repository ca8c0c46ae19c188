#!/bin/sh
# slurm.conf: Epilog=/etc/slurm/gpualloc/epilog.sh — slurmd's node epilog, on each of the
# job's nodes (as SlurmdUser, root) when the job ends there: releases the job's GPUs of this
# node. An alternative to jobcomp.sh (the documented wiring) for a site whose JobCompType is
# taken: Slurm keeps the node COMPLETING while it runs, so it costs each job end there a
# start of this script (docs/bridges.md, "What it costs"). Never with EpilogSlurmctld, which
# delays the next job to Slurm's next periodic pass. Through `gpualloc-slurm hooks --socket` (sync's on the controller) it returns at
# once and the release follows. Slurm drains a node whose Epilog fails, so this one never
# fails: a release that could not be made is done by sync's sweep or by the lease.
# Slurm runs it without PATH: name everything in full.
GPUALLOC_ALLOCATOR_ADDR=${GPUALLOC_ALLOCATOR_ADDR:-gpualloc.example.com:50051}
SLURM_CONF=${SLURM_CONF:-/etc/slurm/slurm.conf}
GPUALLOC_SLURM_SOCKET=${GPUALLOC_SLURM_SOCKET:-/run/gpualloc-slurm.sock}
GPUALLOC_SLURM_CLI=/opt/gpualloc/bin/gpualloc-slurm
export GPUALLOC_ALLOCATOR_ADDR SLURM_CONF GPUALLOC_SLURM_SOCKET GPUALLOC_SLURM_CLI
[ "${SLURM_JOB_NAME-}:${SLURM_JOB_UID-}" = "gpualloc-held:0" ] && exit 0
if [ -x /etc/slurm/gpualloc/gpualloc-hook ]; then
  /etc/slurm/gpualloc/gpualloc-hook epilog --ignore-errors
else
  /usr/bin/python3 -I -S /etc/slurm/gpualloc/gpualloc-hook.py epilog --ignore-errors
fi
exit 0
