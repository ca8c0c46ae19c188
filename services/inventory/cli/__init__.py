"""The inventory's command lines: `gpualloc-agent`, `gpualloc apply`, `gpualloc
inventory`, and the inputs and JSON they read and print.

May import: services.inventory.adapters, .app, .core, services.client, services.common.
"""
