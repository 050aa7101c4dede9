"""Types of the vectorised formulas: a value is a Python scalar (one layout) or a numpy column
(one row per candidate layout, ``paraplan.layout.LayoutTable``); numpy's operator typing carries
either through the arithmetic."""

from __future__ import annotations

from typing import TypeAlias

import numpy as np
from numpy.typing import NDArray

Num: TypeAlias = float | NDArray[np.float64] | NDArray[np.int64]
"""A real quantity (seconds, bytes, FLOPs, ...), scalar or per candidate; ints are accepted."""
Int: TypeAlias = int | NDArray[np.int64]
"""A count or parallel size, scalar or per candidate."""
Bool: TypeAlias = bool | NDArray[np.bool_]
"""A switch, scalar or per candidate."""
