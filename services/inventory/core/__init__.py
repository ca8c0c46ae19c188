"""The inventory's pure core: per-node state, merging slices with node reports, MIG, topology,
the versioned view.

May import services.common only; pure (no grpc, redis, protobuf, clock, environment).
"""
