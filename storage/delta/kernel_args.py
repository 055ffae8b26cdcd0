"""How arrays go into the codec's numba kernels (storage/delta/kernels.py, value_kernels.py)."""
from __future__ import annotations

import numpy as np


def read_only(array: np.ndarray) -> np.ndarray:
    """A read-only view: numba compiles one specialisation per argument type, and read-only
    is part of the type, so inputs always go in read-only (a writable and a read-only bucket
    view would otherwise compile a kernel twice, seconds each, inside a timed publish)."""
    view = array.view()
    view.flags.writeable = False
    return view
