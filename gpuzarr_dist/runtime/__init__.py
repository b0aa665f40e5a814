"""Runtime: devices, thread pools (and, on the GPU, streams and memory pools).

Nothing in this layer knows about dask.
"""
