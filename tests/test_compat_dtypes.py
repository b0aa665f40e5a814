"""Non-numeric data types on the CPU device, returned as zarr-python returns them (values and dtype).

Fixed-length strings and bytes, structured types, variable-length strings
and bytes (Zarr v2 object arrays with ``vlen-utf8``/``vlen-bytes``, Zarr v3
``string``/``bytes`` data types). On the GPU device such an array raises
:class:`UnsupportedDtypeError` when the graph is built.
"""

from __future__ import annotations

import numpy as np
import pytest
import zarr
from zarr.dtype import VariableLengthBytes

import gpuzarr_dist as gz
from gpuzarr_dist.errors import GpuZarrError, UnsupportedDtypeError

# zarr-python warns that these data types have no Zarr v3 specification yet; writing them is the point here
pytestmark = pytest.mark.filterwarnings("ignore:The data type .* does not have a Zarr V3 specification")

WORDS = ["a", "bb", "", "héllo wörld", "x" * 9, "ζ", "tail", "z"] * 4  # 32 values, one chunk absent below
STRUCT = np.dtype([("a", "<i4"), ("b", "<f8"), ("c", "S3")])


def _values(kind: str) -> tuple[object, np.ndarray]:
    if kind == "U":
        return "<U7", np.array(WORDS, dtype="<U7")
    if kind == "S":
        return "|S5", np.array([w.encode()[:5] for w in WORDS], dtype="S5")
    if kind == "structured":
        return STRUCT, np.array([(i, i / 3, str(i).encode()) for i in range(len(WORDS))], dtype=STRUCT)
    if kind == "str":
        return str, np.array(WORDS, dtype=object)
    if kind == "bytes":
        return VariableLengthBytes(), np.array([w.encode() or b"-" for w in WORDS], dtype=object)
    raise AssertionError(kind)


def _write(path: str, kind: str, fmt: int) -> None:
    dtype, values = _values(kind)
    z = zarr.create_array(path, shape=(len(values) + 5,), chunks=(6,), dtype=dtype, zarr_format=fmt)
    z[: len(values)] = values  # the last chunk is partly written, one never: fill values too


def _assert_same(got: np.ndarray, ref: np.ndarray) -> None:
    assert got.dtype == ref.dtype, (got.dtype, ref.dtype)
    assert got.shape == ref.shape
    assert got.tolist() == ref.tolist()


@pytest.mark.parametrize("fmt", [2, 3])
@pytest.mark.parametrize("kind", ["U", "S", "structured", "str", "bytes"])
def test_cpu_reads_non_numeric_as_zarr_python(tmp_path, kind, fmt):
    path = str(tmp_path / f"{kind}.zarr")
    _write(path, kind, fmt)
    ref = zarr.open_array(path, mode="r")[...]
    x = gz.from_zarr_gpu(path, device="cpu", chunks=(12,))
    assert x.dtype == ref.dtype
    _assert_same(x.compute(), ref)
    _assert_same(x[3:29:4].compute(), ref[3:29:4])


def test_v2_object_array_with_vlen_utf8_and_a_compressor(tmp_path):
    import numcodecs

    path = str(tmp_path / "o.zarr")
    z = zarr.create_array(path, shape=(20,), chunks=(7,), dtype=str, zarr_format=2,
                          compressors=numcodecs.BZ2())  # vlen-utf8 filter, then a numcodecs-only compressor
    z[:15] = np.array(WORDS[:15], dtype=object)
    _assert_same(gz.from_zarr_gpu(path, device="cpu").compute(), zarr.open_array(path, mode="r")[...])


@pytest.mark.parametrize("kind", ["U", "str", "structured"])
def test_gpu_device_refuses_non_numeric_when_the_graph_is_built(tmp_path, kind):
    from gpuzarr_dist.array.reader import BlockReader
    from gpuzarr_dist.stores.source import open_source

    path = str(tmp_path / "s.zarr")
    _write(path, kind, 3)
    store, spec = open_source(path)
    with pytest.raises(UnsupportedDtypeError) as info:  # the reader is made in the client, before any task
        BlockReader(store, spec, "gpu")
    msg = str(info.value)
    assert path in msg and 'device="cpu"' in msg and str(spec.dtype) in msg
    assert isinstance(info.value, GpuZarrError) and isinstance(info.value, TypeError)
    BlockReader(store, spec, "cpu")  # the CPU device takes it


@pytest.mark.gpu
def test_gpu_string_array_raises_at_graph_build(tmp_path):
    path = str(tmp_path / "s.zarr")
    _write(path, "str", 3)
    with pytest.raises(UnsupportedDtypeError, match='device="cpu"'):
        gz.from_zarr_gpu(path, device="gpu")
    _assert_same(gz.from_zarr_gpu(path, device="cpu").compute(), zarr.open_array(path, mode="r")[...])
