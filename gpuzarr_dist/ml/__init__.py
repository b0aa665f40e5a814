"""Training on Zarr: :class:`ZarrLoader` yields batches of windows of a group's variables (or of one array),
read and decoded ahead of the training step, shared between the ranks of a distributed run."""

from gpuzarr_dist.ml.loader import ZarrLoader

__all__ = ["ZarrLoader"]
