"""Dask arrays: the read graph, the block reader, windows, the array writer."""
