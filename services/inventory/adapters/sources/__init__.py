"""Where inventory facts come from: ResourceSlices from Kubernetes, nvidia-smi XML, NVML,
`nvidia-smi topo -m`, node reports as JSON.

May import: services.inventory.app, .core, services.common.
"""
