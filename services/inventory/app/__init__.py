"""The inventory's use cases (apply, delete, record node reports, publish the view) and
its instruments.

May import: services.inventory.core, services.common.
"""
