#!/bin/sh
# slurm.conf: EpilogSlurmctld=/etc/slurm/gpualloc/epilog-slurmctld.sh — runs on the controller
# (as SlurmUser) when the job ends (completed, failed, cancelled, requeued). Releases the job's
# GPUs in gpualloc on every node (idempotent), then (--sweep) those of this cluster's jobs that
# ended while gpualloc was unreachable. Through the socket it returns at once and the release
# follows (the next prolog waits for it). A failing EpilogSlurmctld drains nothing: if gpualloc
# cannot be told, the reservation stays held until the next EpilogSlurmctld or
# `gpualloc-slurm sync` pass that reaches it, or until its lease (GPUALLOC_SLURM_LEASE) expires.
# Slurm runs it without PATH: name everything in full.
GPUALLOC_ALLOCATOR_ADDR=${GPUALLOC_ALLOCATOR_ADDR:-gpualloc.example.com:50051}
SLURM_CONF=${SLURM_CONF:-/etc/slurm/slurm.conf}
GPUALLOC_SLURM_SOCKET=${GPUALLOC_SLURM_SOCKET:-/run/gpualloc-slurm.sock}
GPUALLOC_SLURM_CLI=/opt/gpualloc/bin/gpualloc-slurm
export GPUALLOC_ALLOCATOR_ADDR SLURM_CONF GPUALLOC_SLURM_SOCKET GPUALLOC_SLURM_CLI
# gpualloc-slurm sync's holder jobs (named gpualloc-held, submitted by root) need nothing
# here; skipping them in the shell spares the controller a Python start per holder.
[ "${SLURM_JOB_NAME-}:${SLURM_JOB_UID-}" = "gpualloc-held:0" ] && exit 0
# The hook client hands the job to `gpualloc-slurm sync --socket` (or, on a compute node,
# `gpualloc-slurm hooks --socket`), which does the work; when nothing listens there it runs
# $GPUALLOC_SLURM_CLI epilog itself. gpualloc-hook is the compiled one (a start of about a
# millisecond; `make peers` builds it), gpualloc-hook.py the portable one (a `python3 -I -S` start
# of built-in modules only, 10-100 ms on a loaded machine): the first one there is used.
[ -x /etc/slurm/gpualloc/gpualloc-hook ] && exec /etc/slurm/gpualloc/gpualloc-hook epilog --all-nodes --sweep
exec /usr/bin/python3 -I -S /etc/slurm/gpualloc/gpualloc-hook.py epilog --all-nodes --sweep
