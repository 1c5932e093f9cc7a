"""The 2026 corpus: every case of tpu-inference, tokamax 0.0.17, MaxText and JAX 0.12."""

from .tpu_inference_corpus import TPU_INFERENCE_CASES

CASES_2026 = [*TPU_INFERENCE_CASES]
