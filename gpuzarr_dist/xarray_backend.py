"""Deprecated: moved to :mod:`gpuzarr_dist.xarray.backend`; this path goes in the next release."""

from gpuzarr_dist._deprecated import moved

__getattr__ = moved(__name__, "gpuzarr_dist.xarray.backend")
