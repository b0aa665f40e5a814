"""Synthetic data: an ERA5-like temperature store, for the demo, the benchmarks and the tests.

:func:`make_era5_like` writes a Zarr v3 array shaped like one ERA5 variable on
the 0.25 degree grid: (time, 721, 1440) float32, one time step per chunk, zstd
level 0, the layout climate archives use. Values are smooth and
temperature-like (a latitude gradient, a seasonal cycle with opposite
hemispheres, travelling waves and small-scale noise), so the data compresses
about as badly as real reanalysis output does (ratio about 1.3). While
writing, it sums every value in float64: the reference a time mean is checked
against (:meth:`Era5Store.reference_mean`). :class:`Field` and :func:`slabs`
generate the same values without writing them.
"""

from __future__ import annotations

import math
import os
import shutil
import time
import warnings
from collections.abc import Iterator
from typing import IO, Any

import numpy as np

NLAT = 721
NLON = 1440
#: time steps when no number is given: about 2.5 GB on a GPU, a few seconds of work on a CPU
DEFAULT_TIME_STEPS = {"gpu": 600, "cpu": 48}
_MARKER = "gpuzarr_dist_demo"
_SLAB = 8  # time steps generated and written per call (33 MB of float32)


class Era5Store:
    """A store written (or found) by :func:`make_era5_like`."""

    def __init__(self, path: str, component: str | None, shape: tuple[int, ...], seed: int,
                 reused: bool, reference: np.ndarray | None = None):
        self.path = path
        #: the array's path inside the group at ``path``; None when ``path`` is the array itself
        self.component = component
        self.shape = shape
        self.seed = seed
        #: True when an existing, complete store was reused and nothing was written
        self.reused = reused
        self._reference = reference

    @property
    def array_path(self) -> str:
        return os.path.join(self.path, *self.component.split("/")) if self.component else self.path

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * 4

    def stored_bytes(self) -> int:
        """Bytes of the array's chunk files on disk."""
        return sum(
            os.path.getsize(os.path.join(d, f))
            for d, _, files in os.walk(self.array_path)
            for f in files
            if f != "zarr.json"
        )

    def reference_mean(self) -> np.ndarray:
        """The time mean in float64 of the values written, summed while writing.

        For a reused store the same values are generated again (deterministic
        from the seed in the array's attributes) and summed, without reading
        the store.
        """
        if self._reference is None:
            total = np.zeros(self.shape[1:], dtype=np.float64)
            for slab in slabs(Field(self.seed), self.shape[0]):
                total += slab.sum(axis=0, dtype=np.float64)
            self._reference = total / self.shape[0]
        return self._reference

    def __repr__(self) -> str:
        return f"Era5Store({self.path!r}, component={self.component!r}, shape={self.shape}, reused={self.reused})"


class _Bar:
    """A one-line progress indicator in the style of dask's ProgressBar."""

    def __init__(self, label: str, total: int, out: IO[str] | None, width: int = 40):
        self.label, self.total, self.out, self.width = label, total, out, width
        self.start = time.perf_counter()
        self._tty = bool(out is not None and getattr(out, "isatty", lambda: False)())
        self._last = -1

    def update(self, done: int) -> None:
        if self.out is None:
            return
        # on a terminal redraw in place; elsewhere (logs, pipes) print about ten lines at most
        step = max(1, self.total // 10)
        if not self._tty and done != self.total and done - self._last < step:
            return
        self._last = done
        filled = int(self.width * done / max(self.total, 1))
        line = f"[{'#' * filled}{' ' * (self.width - filled)}] {done}/{self.total} {self.label} | {time.perf_counter() - self.start:.1f}s"
        self.out.write(("\r" if self._tty else "") + line + ("" if self._tty and done < self.total else "\n"))
        self.out.flush()


class Field:
    """Deterministic ERA5-like 2 m temperature, one (721, 1440) float32 field per day."""

    def __init__(self, seed: int, nlat: int = NLAT, nlon: int = NLON):
        self.seed = seed
        self.lat = np.linspace(90.0, -90.0, nlat)  # north to south, as ERA5 stores it
        self.lon = np.arange(nlon) * (360.0 / nlon)
        self.phi = np.deg2rad(self.lat).astype(np.float32)[:, None]
        self.lam = np.deg2rad(self.lon).astype(np.float32)[None, :]
        cphi = np.cos(self.phi)
        self.cphi = cphi
        # about 299 K at the equator and 254 K at the poles, with continents-like zonal structure
        self.climate = (
            299.0 - 45.0 * np.sin(self.phi) ** 2 + 4.0 * cphi * np.cos(2 * self.lam) + 2.0 * cphi**2 * np.sin(3 * self.lam)
        ).astype(np.float32)

    def step(self, t: int) -> np.ndarray:
        rng = np.random.default_rng([self.seed, t])
        # seasonal cycle of +-12 K at the poles, opposite in the two hemispheres, coldest north in January
        season = (-12.0 * np.sin(self.phi) * math.cos(2 * math.pi * (t - 15) / 365.25)).astype(np.float32)
        out = self.climate + season
        for _ in range(4):  # weather: a few travelling waves of a few kelvin
            amp = float(rng.uniform(0.5, 2.5))
            kz, m = int(rng.integers(2, 12)), int(rng.integers(1, 8))
            p, q = float(rng.uniform(0, 2 * math.pi)), float(rng.uniform(0, 2 * math.pi))
            out += (amp * self.cphi * np.sin(m * self.phi + q)).astype(np.float32) * np.sin(kz * self.lam + p)
        out += rng.standard_normal(out.shape, dtype=np.float32) * np.float32(0.5)
        return out


def slabs(field: Field, time_steps: int) -> Iterator[np.ndarray]:
    """``field``'s first ``time_steps`` steps, ``_SLAB`` at a time (``(n, nlat, nlon)`` float32), generated on a few
    threads (numpy releases the GIL)."""
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(min(4, os.cpu_count() or 1), thread_name_prefix="gpuzarr-demo") as pool:
        for t0 in range(0, time_steps, _SLAB):
            yield np.stack(list(pool.map(field.step, range(t0, min(time_steps, t0 + _SLAB)))))


def existing_store(path: str, component: str | None, time_steps: int | None) -> Era5Store | None:
    """The complete demo store at ``path`` if there is one (of ``time_steps`` steps when given)."""
    import zarr

    if not os.path.exists(os.path.join(path, "zarr.json")):
        return None
    try:
        arr = zarr.open_array(path, path=component or "", mode="r")
        meta = arr.attrs.get(_MARKER)
        if not isinstance(meta, dict) or not meta.get("complete"):
            return None
        shape = tuple(arr.shape)
        if len(shape) != 3 or shape[1:] != (NLAT, NLON) or arr.dtype != np.float32 or arr.chunks != (1, NLAT, NLON):
            return None
        if time_steps is not None and shape[0] != time_steps:
            return None
        seed = int(meta["seed"])
    except Exception:  # anything unreadable is not a store we can reuse
        return None
    return Era5Store(path, component, shape, seed, reused=True)


def _is_demo_store(path: str) -> bool:
    import zarr

    try:
        node = zarr.open(path, mode="r")
    except Exception:
        return False
    if _MARKER in node.attrs:
        return True
    members = node.arrays() if isinstance(node, zarr.Group) else ()
    return any(_MARKER in a.attrs for _, a in members)


def _check_writable(path: str) -> None:
    """Refuse to overwrite a directory that holds anything but an earlier demo store."""
    if not os.path.exists(path):
        return
    if not os.path.isdir(path):
        raise FileExistsError(f"{path} exists and is not a directory")
    if os.listdir(path) and not _is_demo_store(path):
        raise FileExistsError(f"{path} is not empty and is not a gpuzarr-dist demo store; refusing to overwrite it")


def make_era5_like(
    path: str | os.PathLike,
    time_steps: int | None = None,
    *,
    component: str | None = None,
    seed: int = 0,
    reuse: bool = True,
    progress: IO[str] | None = None,
    processes: int = 1,
) -> Era5Store:
    """Write an ERA5-like Zarr v3 array of shape (``time_steps``, 721, 1440) at ``path``.

    float32 in chunks of one time step (4.15 MB) compressed with zstd level 0,
    dimension names ``time, latitude, longitude``. Without ``component`` the
    array is the store's root (``zarr.open_array(path)`` reads it); with one,
    ``path`` is a group holding the array under that name next to its
    ``time``/``latitude``/``longitude`` coordinates, as a climate archive would.

    Data is generated a few time steps at a time, so memory stays around
    100 MB whatever ``time_steps`` is; the float64 time mean is summed on the
    way (:meth:`Era5Store.reference_mean`). With ``reuse``, a complete store
    already at ``path`` with that many time steps (any number when
    ``time_steps`` is None; default 48 otherwise) is returned as it is.
    ``progress``: a stream for a progress bar (None: silent). ``processes``:
    generate and compress runs of time steps in this many processes at once
    (tens of GB for a benchmark; the values do not depend on it). Only an
    empty directory or an earlier demo store is ever overwritten.
    """
    import zarr
    from zarr.codecs import ZstdCodec

    path = os.path.abspath(os.fspath(path))
    if reuse:
        found = existing_store(path, component, time_steps)
        if found is not None:
            return found
    if time_steps is None:
        time_steps = DEFAULT_TIME_STEPS["cpu"]
    if time_steps < 1:
        raise ValueError(f"time_steps must be at least 1, got {time_steps}")
    _check_writable(path)
    if os.path.exists(path):
        shutil.rmtree(path)  # an earlier demo store: zarr's mode="w" would leave stale chunks of a longer one
    field = Field(seed)
    marker = {"complete": False, "seed": seed, "time_steps": time_steps}
    attrs = {"units": "K", "long_name": "2 metre temperature (synthetic)", _MARKER: marker}
    create: dict[str, Any] = dict(
        shape=(time_steps, NLAT, NLON),
        chunks=(1, NLAT, NLON),
        dtype="float32",
        compressors=ZstdCodec(level=0),
        fill_value=float("nan"),
        dimension_names=("time", "latitude", "longitude"),
        attributes=attrs,
    )
    if component:
        group = zarr.open_group(path, mode="w", zarr_format=3)
        for name, values, cattrs in (
            ("time", np.arange(time_steps, dtype=np.int32), {"units": "days since 2000-01-01", "calendar": "proleptic_gregorian"}),
            ("latitude", field.lat.astype(np.float64), {"units": "degrees_north"}),
            ("longitude", field.lon.astype(np.float64), {"units": "degrees_east"}),
        ):
            coord = group.create_array(name, shape=values.shape, chunks=values.shape, dtype=values.dtype,
                                       dimension_names=(name,), attributes=cattrs)
            coord[...] = values
        arr = group.create_array(component, **create)
    else:
        arr = zarr.create_array(store=path, zarr_format=3, **create)
    bar = _Bar("time steps written", time_steps, progress)
    if processes > 1 and time_steps > _SLAB:
        total = _fill_parallel(path, component, seed, time_steps, processes, bar)
    else:
        total = np.zeros((NLAT, NLON), dtype=np.float64)
        t0 = 0
        for slab in slabs(field, time_steps):
            total += slab.sum(axis=0, dtype=np.float64)
            arr[t0 : t0 + len(slab)] = slab
            t0 += len(slab)
            bar.update(t0)
    arr.attrs[_MARKER] = {**marker, "complete": True}
    if component:  # xarray opens a group with consolidated metadata without a warning
        with warnings.catch_warnings():  # zarr-python notes that Zarr v3 has no such extension yet
            warnings.filterwarnings("ignore", "Consolidated metadata", UserWarning)
            zarr.consolidate_metadata(path)
    return Era5Store(path, component, (time_steps, NLAT, NLON), seed, reused=False, reference=total / time_steps)


def _fill_run(path: str, component: str | None, seed: int, t0: int, t1: int, nlat: int = NLAT,
              nlon: int = NLON) -> np.ndarray:
    """Generate and write time steps ``t0:t1`` of the array at ``path``; their float64 sum over time."""
    import zarr

    arr = zarr.open_array(path, path=component or "", mode="r+")
    field = Field(seed, nlat, nlon)
    total = np.zeros((nlat, nlon), dtype=np.float64)
    for a in range(t0, t1, _SLAB):
        slab = np.stack([field.step(t) for t in range(a, min(t1, a + _SLAB))])
        total += slab.sum(axis=0, dtype=np.float64)
        arr[a : a + len(slab)] = slab
    return total


def _fill_parallel(path: str, component: str | None, seed: int, time_steps: int, processes: int, bar: _Bar | None,
                   nlat: int = NLAT, nlon: int = NLON) -> np.ndarray:
    """:func:`_fill_run` over ``time_steps`` in runs of whole slabs, on ``processes`` processes."""
    from concurrent.futures import ProcessPoolExecutor, as_completed
    from multiprocessing import get_context

    runs = max(processes * 4, 1)
    step = max(_SLAB, -(-time_steps // runs) // _SLAB * _SLAB)
    bounds = [(a, min(time_steps, a + step)) for a in range(0, time_steps, step)]
    total = np.zeros((nlat, nlon), dtype=np.float64)
    done = 0
    with ProcessPoolExecutor(processes, mp_context=get_context("spawn")) as pool:
        futures = {pool.submit(_fill_run, path, component, seed, a, b, nlat, nlon): b - a for a, b in bounds}
        for f in as_completed(futures):
            total += f.result()
            done += futures[f]
            if bar is not None:
                bar.update(done)
    return total


# -- a whole dataset: the variable, its coordinates and a calendar, written by several processes


class Era5Dataset(Era5Store):
    """A store written (or found) by :func:`make_era5_dataset`: a group holding one ERA5-like variable."""

    @property
    def grid(self) -> tuple[int, int]:
        return self.shape[1], self.shape[2]

    def reference_mean(self) -> np.ndarray:
        """The time mean in float64 of the values written (generated again from the seed)."""
        if self._reference is None:
            field = Field(self.seed, *self.grid)
            total = np.zeros(self.grid, dtype=np.float64)
            for t in range(self.shape[0]):
                total += field.step(t)
            self._reference = total / self.shape[0]
        return self._reference


def _existing_dataset(path: str, name: str, time_steps: int, nlat: int, nlon: int, seed: int) -> Era5Dataset | None:
    import zarr

    if not os.path.exists(os.path.join(path, name, "zarr.json")):
        return None
    try:
        arr = zarr.open_array(path, path=name, mode="r")
        meta = arr.attrs.get(_MARKER)
        ok = (isinstance(meta, dict) and meta.get("complete") and int(meta.get("seed", -1)) == seed
              and tuple(arr.shape) == (time_steps, nlat, nlon) and arr.chunks == (1, nlat, nlon)
              and arr.dtype == np.float32)
    except Exception:  # anything unreadable is not a store we can reuse
        return None
    return Era5Dataset(path, name, (time_steps, nlat, nlon), seed, reused=True) if ok else None


def make_era5_dataset(
    path: str | os.PathLike,
    time_steps: int,
    *,
    nlat: int = NLAT,
    nlon: int = NLON,
    name: str = "t2m",
    seed: int = 0,
    reuse: bool = True,
    processes: int | None = None,
) -> Era5Dataset:
    """Write an ERA5-like dataset at ``path``: a Zarr v3 group that ``xr.open_zarr`` opens.

    The group holds ``name`` (float32 ``(time_steps, nlat, nlon)``, the
    values of :class:`Field`, one chunk per time step, zstd level 0) and its
    coordinates ``time`` (daily from 2000-01-01, stored as int32 days with CF
    units, so xarray decodes it to datetime64 and ``"time.month"`` groups
    it), ``latitude`` (90 to -90) and ``longitude``, with consolidated
    metadata. Steps are generated and written by ``processes`` worker
    processes, each its own range of time steps (default: one per CPU core
    for stores over 1 GB, else this process alone). With ``reuse``, a
    complete store of the same shape and seed already at ``path`` is returned
    as it is. Only an empty directory or an earlier store written here is ever
    overwritten.
    """
    import zarr
    from zarr.codecs import ZstdCodec

    path = os.path.abspath(os.fspath(path))
    if time_steps < 1 or nlat < 1 or nlon < 1:
        raise ValueError(f"time_steps, nlat and nlon must be at least 1, got {time_steps}, {nlat}, {nlon}")
    if reuse:
        found = _existing_dataset(path, name, time_steps, nlat, nlon, seed)
        if found is not None:
            return found
    _check_writable(path)
    if os.path.exists(path):
        shutil.rmtree(path)
    field = Field(seed, nlat, nlon)
    marker = {"complete": False, "seed": seed, "time_steps": time_steps}
    group = zarr.open_group(path, mode="w", zarr_format=3)
    for cname, values, cattrs in (
        ("time", np.arange(time_steps, dtype=np.int32), {"units": "days since 2000-01-01", "calendar": "proleptic_gregorian",
                                                          "standard_name": "time"}),
        ("latitude", field.lat.astype(np.float64), {"units": "degrees_north", "standard_name": "latitude"}),
        ("longitude", field.lon.astype(np.float64), {"units": "degrees_east", "standard_name": "longitude"}),
    ):
        coord = group.create_array(cname, shape=values.shape, chunks=values.shape, dtype=values.dtype,
                                   dimension_names=(cname,), attributes=cattrs)
        coord[...] = values
    arr = group.create_array(
        name, shape=(time_steps, nlat, nlon), chunks=(1, nlat, nlon), dtype="float32",
        compressors=ZstdCodec(level=0), fill_value=float("nan"), dimension_names=("time", "latitude", "longitude"),
        attributes={"units": "K", "long_name": "2 metre temperature (synthetic)", _MARKER: marker},
    )
    nbytes = time_steps * nlat * nlon * 4
    if processes is None:
        processes = (os.cpu_count() or 1) if nbytes > 1e9 else 1
    processes = max(1, min(processes, -(-time_steps // _SLAB)))
    if processes == 1:
        _fill_run(path, name, seed, 0, time_steps, nlat, nlon)
    else:
        _fill_parallel(path, name, seed, time_steps, processes, None, nlat, nlon)
    arr.attrs[_MARKER] = {**marker, "complete": True}
    with warnings.catch_warnings():  # zarr-python notes that Zarr v3 has no consolidated metadata extension yet
        warnings.filterwarnings("ignore", "Consolidated metadata", UserWarning)
        zarr.consolidate_metadata(path)
    return Era5Dataset(path, name, (time_steps, nlat, nlon), seed, reused=False)
