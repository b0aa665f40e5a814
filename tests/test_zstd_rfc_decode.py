"""The pure-Python RFC 8878 reader that ``dev/replay_zstd.py`` uses as a third opinion: equal to libzstd on valid frames."""

from __future__ import annotations

import numcodecs
import numpy as np
import pytest

from tests.helpers import zstd_rfc_decode as rfc


def _payloads() -> dict[str, bytes]:
    rng = np.random.default_rng(5)
    return {
        "smooth": np.cumsum(rng.standard_normal(6000)).astype("<f4").tobytes(),
        "quantised": (rng.integers(0, 4, 9000) * 0.5).astype("<f8").tobytes(),
        "text": b"the quick brown fox jumps over the lazy dog; " * 300,
        "random": rng.bytes(3000),
        "constant": bytes(5000),
        "multiblock": np.linspace(0, 200, 40000).astype("<f4").tobytes(),  # 160 KB: more than one zstd block
    }


@pytest.mark.parametrize("level", [-3, 1, 9, 19])
@pytest.mark.parametrize("name", list(_payloads()))
def test_valid_frames_decode_as_libzstd_decodes_them(name, level):
    data = _payloads()[name]
    frame = bytes(numcodecs.Zstd(level=level, checksum=bool(level % 2)).encode(data))
    out, notes, _ = rfc.decode(frame)
    assert bytes(out) == data == bytes(numcodecs.Zstd().decode(frame))
    assert not notes, notes


def test_a_frame_that_cannot_be_read_raises_corrupt():
    frame = bytearray(numcodecs.Zstd(level=3).encode(b"abc" * 1000))
    frame[0] ^= 0xFF  # no longer the zstd magic number
    with pytest.raises(rfc.Corrupt):
        rfc.decode(bytes(frame))
