"""``python -m pytest_pallas.roofline_plot``, the documented command: runs
``pytest_pallas.bench.plot``.
"""

from .bench.plot import main

if __name__ == "__main__":
    raise SystemExit(main())
