"""How the GPU view reaches the allocator: the inventory's watch stream and topology
files.

May import: services.allocator.app (the feed port), .core, services.client,
services.common, protos.
"""
