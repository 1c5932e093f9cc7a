"""Reference Pallas TPU kernels, one module per family, each kernel beside its oracle and
cost model."""
