"""paraplan: plan hybrid parallelism for Megatron-LM training.

Library first: specs (model, GPU/cluster, training) -> layouts -> memory and step-time
estimates -> ranked plans. The CLI (``paraplan``) is a thin layer over these functions.
"""

from __future__ import annotations

__version__ = "0.1.0"

__all__ = ["__version__"]
