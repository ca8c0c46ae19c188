"""The allocator's use cases (placing, the reservation life cycle, capacity counting,
holders, gangs, quotas), their messages, in-process read models and ports.

May import: services.allocator.reservations, services.allocator.core, services.cel's
door, services.common. Never an adapter, grpc, redis or protobuf.
"""
