"""The allocator's command lines (`gpualloc solve`): offline what-ifs on files.

May import: services.allocator.app, .adapters, .core, services.common.
"""
