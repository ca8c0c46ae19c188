#!/bin/sh
# slurm.conf: TaskProlog=/etc/slurm/gpualloc/taskprolog.sh — runs as the job's user before each
# task. Prints `export CUDA_VISIBLE_DEVICES=GPU-…` (the UUIDs of the step's GPUs, the ones Slurm
# gave the step and gpualloc holds for the job) and GPUALLOC_* for Slurm to apply. A task of a
# job that asked for GPUs but holds no reservation fails (exit 4) with a `print` line saying
# why; a job that asked for no GPU gets no GPU variable.
GPUALLOC_ALLOCATOR_ADDR=${GPUALLOC_ALLOCATOR_ADDR:-gpualloc.example.com:50051}
GPUALLOC_SLURM_SOCKET=${GPUALLOC_SLURM_SOCKET:-/run/gpualloc-slurm.sock}
GPUALLOC_SLURM_CLI=/opt/gpualloc/bin/gpualloc-slurm
export GPUALLOC_ALLOCATOR_ADDR GPUALLOC_SLURM_SOCKET GPUALLOC_SLURM_CLI
# gpualloc-slurm sync's holder jobs (named gpualloc-held, submitted by root) need nothing
# here; skipping them in the shell spares the controller a Python start per holder.
[ "${SLURM_JOB_NAME-}:${SLURM_JOB_UID-}" = "gpualloc-held:0" ] && exit 0
# The hook client hands the job to `gpualloc-slurm sync --socket` (or, on a compute node,
# `gpualloc-slurm hooks --socket`), which does the work; when nothing listens there it runs
# $GPUALLOC_SLURM_CLI task-prolog itself. gpualloc-hook is the compiled one (a start of about a
# millisecond; `make peers` builds it), gpualloc-hook.py the portable one (a `python3 -I -S` start
# of built-in modules only, 10-100 ms on a loaded machine): the first one there is used.
[ -x /etc/slurm/gpualloc/gpualloc-hook ] && exec /etc/slurm/gpualloc/gpualloc-hook task-prolog
exec /usr/bin/python3 -I -S /etc/slurm/gpualloc/gpualloc-hook.py task-prolog
