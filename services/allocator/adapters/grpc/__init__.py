"""The allocator's gRPC edge: the servicer and the protobuf mapping of its messages.

May import: services.allocator.app, .reservations, .core, services.common, protos.
"""
