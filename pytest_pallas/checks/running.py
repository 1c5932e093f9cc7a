"""The backend of the Pallas test running now, for the checks that run inside it.

``Backend.activate`` (``pytest_pallas.backend``) sets it for the duration of a test; a check
that must call a kernel the way the test's backend does (in the TPU interpreter, with the
run's interpreter parameters) reads it here, below the backend.
"""

from __future__ import annotations

import contextvars
from typing import Any

ACTIVE_BACKEND: contextvars.ContextVar[Any] = contextvars.ContextVar(
    "pallas_active_backend", default=None)


def active_backend() -> Any:
    """The backend of the Pallas test running now (inside ``Backend.activate``), else None."""
    return ACTIVE_BACKEND.get()
