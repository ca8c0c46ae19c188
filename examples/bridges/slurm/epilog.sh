#!/bin/sh
# slurm.conf: Epilog=/etc/slurm/gpualloc/epilog.sh — runs as root on each node at job end.
# Releases the job's GPUs in gpualloc (idempotent). A failing Epilog drains the node, which
# is what you want if gpualloc cannot be told (the GPUs would stay held); add --ignore-errors
# to keep nodes up instead.
GPUALLOC_ALLOCATOR_ADDR=${GPUALLOC_ALLOCATOR_ADDR:-gpualloc.example.com:50051}
export GPUALLOC_ALLOCATOR_ADDR
exec /opt/gpualloc/bin/gpualloc-slurm epilog
