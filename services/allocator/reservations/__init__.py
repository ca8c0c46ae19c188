"""The pure reservation domain: the Reservation model and its store port, the holds a
placement takes, the quota ledger's port.

May import: services.allocator.core, services.common. Pure: no grpc, redis, protobuf,
clock or environment.
"""
