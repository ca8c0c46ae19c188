#!/bin/sh
# slurm.conf: Epilog=/etc/slurm/gpualloc/epilog.sh — slurmd's node epilog, on each of the
# job's nodes (as SlurmdUser, root) when the job ends there: releases the job's GPUs of this
# node, and returns once they are released (through `gpualloc-slurm hooks --socket`: at most
# 5 s). Slurm keeps the node COMPLETING, and starts no job there, until it returns, so the
# GPUs are free in gpualloc before Slurm offers them again. The portable form of the
# documented wiring (slurm.conf's Epilog= names the compiled client's `epilog` link; this
# script is for a site without it: a shell per job end). Never with EpilogSlurmctld, which
# delays the next job to Slurm's next periodic pass (docs/bridges.md, "What it costs"). Slurm
# drains a node whose Epilog fails, so this one never fails: a release that could not be made
# is done by sync's sweep or by the lease.
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
