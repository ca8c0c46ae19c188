"""A Python stand-in for ghz: the same config files in, the same JSON report out.

`config` reads ghz config files, `method` finds the call by server reflection, `engine` drives
the load, `report` computes ghz's report, `summary` and `plot` show it, `cli` is
`gpualloc-load` / `python -m loadtest`. See docs/performance.md, "Load tests".
"""
