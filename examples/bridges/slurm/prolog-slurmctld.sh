#!/bin/sh
# slurm.conf: PrologSlurmctld=/etc/slurm/gpualloc/prolog-slurmctld.sh — runs on the controller
# (as SlurmUser) once Slurm has allocated the job, before anything of it starts on a node.
# Reserves in gpualloc exactly the GPUs Slurm picked on each node (owner
# slurm/job/$SLURM_JOB_ID; the ids from `scontrol show job -d`), all nodes or none. When gpualloc
# cannot place them (another owner holds one, or gpualloc is unreachable after its retries), it
# exits non-zero: Slurm requeues a batch job (cancels an interactive one) without draining any
# node, and the reason is in the job's Comment (`squeue -o "%i %T %k"`, `scontrol show job`).
# The reservation has a lease (GPUALLOC_SLURM_LEASE) that `gpualloc-slurm sync` renews while
# the job runs, so a lost release frees the GPUs by itself; it must match sync's.
# Slurm runs it without PATH: name everything in full.
GPUALLOC_ALLOCATOR_ADDR=${GPUALLOC_ALLOCATOR_ADDR:-gpualloc.example.com:50051}
GPUALLOC_SLURM_LEASE=${GPUALLOC_SLURM_LEASE:-10m}
SLURM_CONF=${SLURM_CONF:-/etc/slurm/slurm.conf}
GPUALLOC_SLURM_SOCKET=${GPUALLOC_SLURM_SOCKET:-/run/gpualloc-slurm.sock}
GPUALLOC_SLURM_CLI=/opt/gpualloc/bin/gpualloc-slurm
export GPUALLOC_ALLOCATOR_ADDR GPUALLOC_SLURM_LEASE SLURM_CONF GPUALLOC_SLURM_SOCKET GPUALLOC_SLURM_CLI
# gpualloc-slurm sync's holder jobs (named gpualloc-held, submitted by root) need nothing
# here; skipping them in the shell spares the controller a Python start per holder.
[ "${SLURM_JOB_NAME-}:${SLURM_JOB_UID-}" = "gpualloc-held:0" ] && exit 0
# The hook client hands the job to `gpualloc-slurm sync --socket` (or, on a compute node,
# `gpualloc-slurm hooks --socket`), which does the work; when nothing listens there it runs
# $GPUALLOC_SLURM_CLI prolog itself. gpualloc-hook is the compiled one (a start of about a
# millisecond; `make peers` builds it), gpualloc-hook.py the portable one (a `python3 -I -S` start
# of built-in modules only, 10-100 ms on a loaded machine): the first one there is used.
[ -x /etc/slurm/gpualloc/gpualloc-hook ] && exec /etc/slurm/gpualloc/gpualloc-hook prolog
exec /usr/bin/python3 -I -S /etc/slurm/gpualloc/gpualloc-hook.py prolog
