"""The operations: the ``Operation`` record, the built-in records, the registry, their
inputs, domains, error models and plain-XLA versions.

A new op is a record in ``builtins`` (or a user's ``Operation``); what an op needs
to be drawn, judged or timed belongs to its record.
"""
