"""Inventory repositories: embedded, Redis, and the state codec they share.

May import: services.inventory.core, .adapters.sources (report JSON), services.common.
"""
