#!/bin/sh
# slurm.conf: JobCompType=jobcomp/script and JobCompLoc=/etc/slurm/gpualloc/jobcomp.sh —
# slurmctld runs it on the controller (as SlurmUser) for every job that ends, is cancelled or is
# requeued, in a thread of its own, one job after the other: off the path of Slurm's scheduling.
# Releases the job's GPUs in gpualloc on every node (idempotent), then (--sweep) those of this
# cluster's ended jobs that an earlier release missed. Through the socket it returns at once and
# the release follows (a prolog that comes meanwhile waits for it, or frees what an ended job
# still holds of Slurm's pick). The wiring for a site that runs no hooks service on its compute
# nodes (the documented one releases in the node Epilog, epilog.sh or the compiled client's
# `epilog` link). It takes the place of an EpilogSlurmctld because Slurm 22.05
# starts the next job on the GPUs a job leaves only at its next periodic pass (30 s by default)
# when an EpilogSlurmctld is configured, any, even `exit 0` (docs/bridges.md, "What it costs").
# A failing script drains nothing: the GPUs stay held until the next release that reaches
# gpualloc, `gpualloc-slurm sync`'s next pass, or the end of their lease (GPUALLOC_SLURM_LEASE).
# slurmctld runs it with its own variables (JOBID, JOBNAME, USERNAME, NODES, CLUSTER: empty
# without accounting; the service then uses its own ClusterName) and no PATH: name everything
# in full.
GPUALLOC_ALLOCATOR_ADDR=${GPUALLOC_ALLOCATOR_ADDR:-gpualloc.example.com:50051}
SLURM_CONF=${SLURM_CONF:-/etc/slurm/slurm.conf}
GPUALLOC_SLURM_SOCKET=${GPUALLOC_SLURM_SOCKET:-/run/gpualloc-slurm.sock}
GPUALLOC_SLURM_CLI=/opt/gpualloc/bin/gpualloc-slurm
export GPUALLOC_ALLOCATOR_ADDR SLURM_CONF GPUALLOC_SLURM_SOCKET GPUALLOC_SLURM_CLI
# gpualloc-slurm sync's holder jobs (named gpualloc-held, submitted by root) hold nothing.
[ "${JOBNAME-}:${USERNAME-}" = "gpualloc-held:root" ] && exit 0
# the job as a Slurm epilog names it
SLURM_JOB_ID=${JOBID-} SLURM_JOB_NAME=${JOBNAME-} SLURM_JOB_NODELIST=${NODES-}
SLURM_CLUSTER_NAME=${CLUSTER-}
export SLURM_JOB_ID SLURM_JOB_NAME SLURM_JOB_NODELIST SLURM_CLUSTER_NAME
# The hook client hands the job to `gpualloc-slurm sync --socket`, which does the work; when
# nothing listens there it runs $GPUALLOC_SLURM_CLI epilog itself. gpualloc-hook is the compiled
# one (`make peers` builds it), gpualloc-hook.py the portable one: the first one there is used.
[ -x /etc/slurm/gpualloc/gpualloc-hook ] && exec /etc/slurm/gpualloc/gpualloc-hook epilog --all-nodes --sweep
exec /usr/bin/python3 -I -S /etc/slurm/gpualloc/gpualloc-hook.py epilog --all-nodes --sweep
