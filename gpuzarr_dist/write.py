"""Deprecated: moved to :mod:`gpuzarr_dist.array.write` and the modules it builds on; this path goes in the next release.

``to_zarr_gpu`` (arrays and Datasets) is :mod:`gpuzarr_dist`'s; the chunk and
shard layout is in :mod:`gpuzarr_dist.core.layout`, the target and its
metadata in :mod:`gpuzarr_dist.stores.target`, the block encoders in
:mod:`gpuzarr_dist.codecs.encode`.
"""

import importlib

from gpuzarr_dist._deprecated import moved

#: where the old names live now: the modules that define them first (array.write imports some of them)
_HOMES = ("gpuzarr_dist.core.layout", "gpuzarr_dist.stores.target", "gpuzarr_dist.codecs.encode",
          "gpuzarr_dist.array.write")
_public = moved(__name__, "gpuzarr_dist")


def __getattr__(name: str):
    if name == "to_zarr_gpu":  # array.write's own to_zarr_gpu takes arrays only
        return _public(name)
    for home in _HOMES:
        if not name.startswith("_") and hasattr(importlib.import_module(home), name):
            return moved(__name__, home)(name)
    return moved(__name__, _HOMES[-1])(name)  # the AttributeError (or a dunder's) as before
