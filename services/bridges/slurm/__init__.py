"""The Slurm bridge (`gpualloc-slurm`): GRES requests -> claims, prolog / task prolog / epilog,
gres.conf from the inventory."""
