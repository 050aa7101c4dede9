"""Types of the vectorised formulas: a value is a Python scalar (one layout) or a numpy column
(one row per candidate layout, ``paraplan.layout.LayoutTable``); numpy's operator typing carries
either through the arithmetic."""

from __future__ import annotations

from typing import Any, TypeAlias

import numpy as np
from numpy.typing import NDArray

FloatArray: TypeAlias = NDArray[np.floating[Any]]
"""A float column. ``Any`` is numpy's bit-width parameter only (numpy types int64 x float64
arithmetic as ``floating[Any]``); the values are float64."""
Num: TypeAlias = float | FloatArray | NDArray[np.int64]
"""A real quantity (seconds, bytes, FLOPs, ...), scalar or per candidate; ints are accepted."""
Int: TypeAlias = int | NDArray[np.int64]
"""A count or parallel size, scalar or per candidate."""
Bool: TypeAlias = bool | NDArray[np.bool_]
"""A switch, scalar or per candidate."""
