"""Where each device of a simulated TPU slice sits: its chip's coordinates in the slice's
torus and its core on the chip, as ``jax.devices()[i].coords`` and ``.core_on_chip`` report
them on a TPU (imports no JAX).

A run simulates N devices; opted in, a test that builds a mesh from the devices' coordinates
(a library's own mesh builder) reads those of a slice of the stand-in chip with N devices:

- the slice's shape (chips along x, y and z) is the published one for that many chips: the
  Cloud TPU slice shapes of a 2-D torus for v5e and v6e (1x1, 2x2, 2x4, 4x4, 4x8, ...) and of a
  3-D torus for v4, v5p and 7x (2x2x1, 2x2x2, 2x2x4, 2x4x4, 4x4x4, ...); a chip count with no
  published shape gets the most nearly square one, x no larger than y (z than y);
- a chip holds ``devices_per_chip`` devices: its TensorCores over the cores one device drives
  (JAX's chip table: a v5p's two cores are one Megacore device, a 7x's two cores two devices);
- devices are numbered as JAX's own fake TPU devices number them (``mock_tpu_devices`` in JAX's
  tests/mesh_utils_test.py): the core on the chip fastest, then x, then y, then z.
"""

from __future__ import annotations

import dataclasses
import math

# Chips whose slices are a 3-D torus; the others' (v5e, v6e) a 2-D one, z always 0.
THREE_D_TORUS = ("v4", "v5p", "7x")

# Published slice shapes by chip count (Cloud TPU's v5e/v6e and v4/v5p/7x topologies).
_TWO_D_SHAPES = {1: (1, 1), 4: (2, 2), 8: (2, 4), 16: (4, 4), 32: (4, 8), 64: (8, 8),
                 128: (8, 16), 256: (16, 16)}
_THREE_D_SHAPES = {1: (1, 1, 1), 4: (2, 2, 1), 8: (2, 2, 2), 16: (2, 2, 4), 32: (2, 4, 4),
                   64: (4, 4, 4), 128: (4, 4, 8), 256: (4, 8, 8)}


@dataclasses.dataclass(frozen=True)
class SliceTopology:
    """The torus of a slice of ``chip`` and how its devices are numbered in it."""

    chip: str
    bounds: tuple[int, int, int]  # chips along x, y and z
    devices_per_chip: int

    @property
    def device_count(self) -> int:
        return math.prod(self.bounds) * self.devices_per_chip

    def coords(self, device_index: int) -> tuple[int, int, int]:
        """The coordinates of the chip holding device ``device_index``.

            >>> slice_topology("v5e", 8).coords(3)
            (1, 1, 0)
        """
        chip_index = self._chip_index(device_index)
        x_size, y_size, _ = self.bounds
        return (chip_index % x_size, chip_index // x_size % y_size,
                chip_index // (x_size * y_size))

    def core_on_chip(self, device_index: int) -> int:
        """Which of its chip's devices ``device_index`` is (0 on a one-device chip)."""
        self._chip_index(device_index)
        return device_index % self.devices_per_chip

    def _chip_index(self, device_index: int) -> int:
        if not 0 <= device_index < self.device_count:
            raise ValueError(f"device {device_index} is not in a {self.describe()} slice")
        return device_index // self.devices_per_chip

    def describe(self) -> str:
        """``"v5e 2x4"``, ``"7x 2x2x1 (2 devices per chip)"``."""
        shape = "x".join(map(str, self.bounds if self.chip in THREE_D_TORUS else self.bounds[:2]))
        per_chip = (f" ({self.devices_per_chip} devices per chip)"
                    if self.devices_per_chip > 1 else "")
        return f"{self.chip} {shape}{per_chip}"


def slice_topology(chip: str, device_count: int, devices_per_chip: int = 1) -> SliceTopology:
    """The slice of ``chip`` with ``device_count`` devices, ``devices_per_chip`` on each chip.

        >>> slice_topology("v5p", 8).bounds
        (2, 2, 2)
        >>> slice_topology("7x", 8, devices_per_chip=2).describe()
        '7x 2x2x1 (2 devices per chip)'
    """
    if device_count < 1 or devices_per_chip < 1:
        raise ValueError(f"a slice needs devices: got {device_count}, {devices_per_chip} per chip")
    chips = max(1, device_count // devices_per_chip)
    if chips * devices_per_chip != device_count:  # an odd count on a two-device chip
        chips, devices_per_chip = device_count, 1
    if chip in THREE_D_TORUS:
        bounds = _THREE_D_SHAPES.get(chips) or _nearly_cubic(chips)
    else:
        x_size, y_size = _TWO_D_SHAPES.get(chips) or _nearly_square(chips)
        bounds = (x_size, y_size, 1)
    return SliceTopology(chip=chip, bounds=bounds, devices_per_chip=devices_per_chip)


def _nearly_square(count: int) -> tuple[int, int]:
    x_size = max(divisor for divisor in range(1, math.isqrt(count) + 1) if count % divisor == 0)
    return x_size, count // x_size


def _nearly_cubic(count: int) -> tuple[int, int, int]:
    best = (1, 1, count)
    for z_size in range(1, count + 1):
        if count % z_size:
            continue
        x_size, y_size = _nearly_square(count // z_size)
        if z_size <= y_size and max(x_size, y_size, z_size) < max(best):
            best = (x_size, y_size, z_size)
    return best
