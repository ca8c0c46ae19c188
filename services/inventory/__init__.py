"""The inventory service. Its top level is wiring only (`__main__`, `bootstrap`, `config`);
the rooms, top to bottom: cli, adapters, app, core (docs/architecture.md).

A room imports only the rooms below it (import-linter: "The inventory's rooms are layers").
"""
