"""The device seam: the only subpackage (with ``bench``) that imports cupy, nvCOMP or kvikio."""
