#!/bin/sh
# slurm.conf: TaskProlog=/etc/slurm/gpualloc/taskprolog.sh — runs as the user before each task.
# Prints `export CUDA_VISIBLE_DEVICES=GPU-…,MIG-…` (and GPUALLOC_*) for Slurm to apply.
GPUALLOC_ALLOCATOR_ADDR=${GPUALLOC_ALLOCATOR_ADDR:-gpualloc.example.com:50051}
export GPUALLOC_ALLOCATOR_ADDR
exec /opt/gpualloc/bin/gpualloc-slurm task-prolog
