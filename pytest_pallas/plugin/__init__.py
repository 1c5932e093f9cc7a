"""pytest glue only: hooks, options, fixtures, the per-run session, the timeout watchdog.

A new flag, ini option, marker or fixture goes here; no kernel logic does.
``hooks`` is the module pytest loads (the ``pytest11`` entry point); this package
imports nothing, so that loading the plugin costs no JAX import.
"""
