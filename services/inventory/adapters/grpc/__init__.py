"""The inventory's gRPC edge: servicer, protobuf mappings of the view and node reports.

May import: services.inventory.app, .core, services.common, protos.
"""
