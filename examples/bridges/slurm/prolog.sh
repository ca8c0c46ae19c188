#!/bin/sh
# slurm.conf: Prolog=/etc/slurm/gpualloc/prolog.sh — runs as root on each node of the job.
# Reserves and commits the job's GPUs in gpualloc (owner slurm/job/$SLURM_JOB_ID); a job that
# cannot be placed fails here with gpualloc's reason in the slurmd log.
# Slurm runs prologs without PATH: name everything in full.
GPUALLOC_ALLOCATOR_ADDR=${GPUALLOC_ALLOCATOR_ADDR:-gpualloc.example.com:50051}
export GPUALLOC_ALLOCATOR_ADDR
exec /opt/gpualloc/bin/gpualloc-slurm prolog
