"""The allocator's edges: grpc/ (servicer, protobuf mapping), store/ (reservation stores and
quota ledgers), inventory/ (how the GPU view arrives), web/ (the read-only web view).

They may import the app, reservations and core rooms, never each other.
"""
