"""Unit constants and human formatting. The only module that spells out 2**30 or 1e12.

Internally paraplan uses SI base units: bytes, seconds, FLOPs, bytes/s, FLOP/s.
Capacities are binary (GiB), rates are decimal (GB/s, TFLOP/s), as datasheets quote them.
"""

from __future__ import annotations

from typing import Final

KIB: Final = 2**10
MIB: Final = 2**20
GIB: Final = 2**30
KB: Final = 1e3
MB: Final = 1e6
GB: Final = 1e9
TB: Final = 1e12
GBIT: Final = 1e9 / 8  # bytes in one gigabit
TFLOP: Final = 1e12
PFLOP: Final = 1e15
MS: Final = 1e-3
US: Final = 1e-6
SECONDS_PER_HOUR: Final = 3600.0
SECONDS_PER_DAY: Final = 86400.0


def format_bytes_binary(num_bytes: float) -> str:
    """Bytes as GiB/MiB (binary, 2**30), e.g. ``format_bytes_binary(3*2**30) == '3.00 GiB'``."""
    if abs(num_bytes) >= GIB:
        return f"{num_bytes / GIB:.2f} GiB"
    if abs(num_bytes) >= MIB:
        return f"{num_bytes / MIB:.1f} MiB"
    return f"{num_bytes / KIB:.1f} KiB"


def format_seconds(seconds: float) -> str:
    """Seconds as ms below 1 s, else s (e.g. '812.3 ms', '12.40 s')."""
    if seconds < 1.0:
        return f"{seconds / MS:.1f} ms"
    return f"{seconds:.2f} s"


def format_count(n: float) -> str:
    """Large counts with a decimal suffix: 6.74B, 405.9B, 1.2T."""
    for div, suf in ((1e12, "T"), (1e9, "B"), (1e6, "M"), (1e3, "k")):
        if abs(n) >= div:
            return f"{n / div:.2f}{suf}"
    return f"{n:.0f}"
