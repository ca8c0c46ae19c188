"""Reservation stores and the quota ledger: embedded, Redis (Functions), metered.

May import: services.allocator.app (telemetry), .reservations, services.common, redis.
"""
