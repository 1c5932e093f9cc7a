"""Every use of a pytest-xdist internal, guarded; ``tests/test_stuck_tests.py`` checks it
against the installed pytest-xdist.

* A worker that ``--pallas-timeout`` ended (its test stuck inside XLA) is not a crash:
  xdist's controller (``DSession``) counts every worker end against its restart limit
  (``--max-worker-restart``, by default 4 per worker), past which it stops the run; such an
  end raises the limit it keeps (``DSession._max_worker_restart``) by one. Without that
  attribute (another xdist), each such end counts.
"""

from __future__ import annotations

import pytest


def allow_one_more_worker_restart(config: pytest.Config) -> bool:
    """Raise xdist's limit on worker restarts by one; whether it could."""
    dsession = config.pluginmanager.get_plugin("dsession")
    limit = getattr(dsession, "_max_worker_restart", None)
    if not isinstance(limit, int):
        return False
    dsession._max_worker_restart = limit + 1
    return True
