"""pytest glue only: hooks, options, fixtures and the per-run session (a test's kernels are
supervised in ``supervision/``, the timeout watchdog among them).

A new flag, ini option, marker or fixture goes here; no kernel logic does.
``hooks`` is the module pytest loads (the ``pytest11`` entry point); this package
imports nothing, so that loading the plugin costs no JAX import.
"""
