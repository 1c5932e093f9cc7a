"""``python -m pytest_pallas.benchmark_gate``, the documented command: runs
``pytest_pallas.bench.gate``.
"""

from .bench.gate import main

if __name__ == "__main__":
    raise SystemExit(main())
