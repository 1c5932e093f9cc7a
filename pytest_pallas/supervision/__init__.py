"""Supervising one Pallas test's kernels: the backend and checks around them, the watchdog
around its call, and what its failure means. The plugin opens a ``KernelRun`` per test."""
