"""Every use of a pytest internal, guarded; tests/test_pytest_compat.py checks it against the
installed pytest.

* pytest reports a skip at the line that raised it. The plugin decides some skips in its
  hooks (a marker's ``tpu_only`` in setup, a limit of JAX's interpreters after the call), so
  ``-rs`` would name a line of pluggy's or of the plugin instead of the user's test.
  ``skip.Exception(..., _use_item_location=True)``, what pytest itself raises for a
  ``skipif`` mark or a skip inside a fixture, names the test. pytest 8.0, the oldest the
  project supports, has the keyword (read in its source; CI's pytest is checked by the
  test); a pytest without it reports the skip where it was raised.
"""

from __future__ import annotations

from typing import NoReturn

import pytest


def skip_at_test(reason: str) -> NoReturn:
    """Skip the running test with ``reason``, reported at the test's own line."""
    __tracebackhide__ = True
    try:
        skip = pytest.skip.Exception(reason, _use_item_location=True)
    except TypeError:
        skip = pytest.skip.Exception(reason)
    raise skip
