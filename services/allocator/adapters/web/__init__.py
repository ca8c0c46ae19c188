"""The allocator's read-only web view (HTTP server, server-rendered page, static files).

May import: services.allocator.app, .reservations, .core, services.common.
"""
