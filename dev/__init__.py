"""Maintainers' tools: the GPU fuzz harness and the replays of its cases (not part of the package).

Run from the repository root, e.g. ``python -m dev.gpu_fuzz --help``; see
docs/development.md.
"""
