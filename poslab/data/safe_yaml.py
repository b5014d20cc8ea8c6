"""The YAML alias and depth guard for preset and sweep files: :func:`load` is :func:`poslab.safe_load.load_yaml`.

The guard lives in :mod:`poslab.safe_load` (the package's lowest layer) so that command-line values
(:mod:`poslab.config_keys`) and files go through the same bounds; this module keeps the name the file
readers import.
"""

from __future__ import annotations

from poslab.safe_load import MAX_DEPTH, MAX_VALUES, expanded_size
from poslab.safe_load import load_yaml as load

__all__ = ["MAX_DEPTH", "MAX_VALUES", "expanded_size", "load"]
