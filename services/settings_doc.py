"""The README's configuration section, generated from the settings tables the code reads.

`python -m services.settings_doc` prints it; tests/integration/test_readme.py keeps the README
in sync with it.
"""

from __future__ import annotations

from services.allocator.config import ALLOCATOR_SETTINGS
from services.common.config import (
    DOCUMENT_SETTINGS,
    REDIS_CLIENT_SETTINGS,
    REDIS_WAIT_SETTINGS,
    SERVER_SETTINGS,
    settings_table_markdown,
)
from services.inventory.config import INVENTORY_SETTINGS

__all__ = ["settings_markdown"]

_SHARED = {
    "GPUALLOC_REDIS_URL",
    *(s.name for s in (*REDIS_CLIENT_SETTINGS.values(), *REDIS_WAIT_SETTINGS.values())),
}
"""Read by the inventory too, listed once (in the allocator's table)."""


def settings_markdown() -> str:
    return "\n".join(
        [
            "Every server (`gpualloc serve`, `gpualloc-allocator`, `gpualloc-inventory`):",
            "",
            settings_table_markdown(SERVER_SETTINGS.values()),
            "Allocator (and `gpualloc serve`):",
            "",
            settings_table_markdown(ALLOCATOR_SETTINGS.values()),
            "Inventory (and `gpualloc serve`; `GPUALLOC_REDIS_URL` and `GPUALLOC_REDIS_WAIT_*` are "
            "shared):",
            "",
            settings_table_markdown(
                s for s in INVENTORY_SETTINGS.values() if s.name not in _SHARED
            ),
            "Input limits (the inventory's ApplyResourceSlices manifest, and the `-f` files of "
            '`gpualloc solve`, `inventory` and `apply`; docs/operations.md, "Limits"):',
            "",
            settings_table_markdown(DOCUMENT_SETTINGS.values()),
        ]
    )


if __name__ == "__main__":
    print(settings_markdown(), end="")
