"""The package version (``pyproject.toml`` holds the same string): its own module, at the bottom of the
layers, so that modules that write it into files need not import the package's public API."""

from __future__ import annotations

__version__ = "0.1.0"
