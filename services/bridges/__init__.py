"""Bridges from batch systems to gpualloc: Slurm (slurm/) and Kueue (kueue/) share one GPU view.

Both ask the allocator through the client library (services/client), name their owners the same
way (placing.py), and are checked together by the audit (audit.py); `make demo` (demo.py) runs
them side by side. docs/bridges.md is the guide.
"""
