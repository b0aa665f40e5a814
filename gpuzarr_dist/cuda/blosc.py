"""Blosc1 frames decoded on the GPU: all streams of all chunks of a batch in one nvCOMP call per inner codec.

The host parses and checks the frames (:mod:`.blosc_frames`) into a plan; the
device then runs it on the caller's stream:

1. one upload of the stored frames (and one of the plan's tables) into a
   working buffer;
2. one gather kernel copies every compressed stream to a 256-byte aligned
   start after the frames (zlib streams without their 2-byte header and
   adler32, so nvCOMP's Deflate reads them; nvCOMP crashed on unaligned
   sub-buffers);
3. the streams are checked where nvCOMP trusts them (LZ4 sequences walked,
   zstd frame headers read) and decoded, one batched call per inner codec
   (lz4 and lz4hc: LZ4 block format; zlib: Deflate; zstd: Zstd), each into its
   own aligned slot;
4. one kernel writes every block of the output: byte-unshuffle, bit-unshuffle
   or a copy, reading each byte from the decoded slot (or, for streams and
   frames stored raw, from the stored bytes) with the arithmetic of
   :func:`.blosc_frames.unshuffle_sources` and
   :func:`.blosc_frames.bit_unshuffle_block`.

Frames compressed with blosclz or snappy have no GPU decoder: such a batch is
decoded on the CPU (warned once per compressor). Registers the codec's device
steps (:mod:`.steps`): a decode of its own, and the compressors it takes.

Only imported on the GPU path: importing it imports cupy.
"""

from __future__ import annotations

from collections.abc import Sequence

import cupy
import numpy as np

from gpuzarr_dist.codecs import blosc_frames as bf
from gpuzarr_dist.codecs.pipeline import CodecPipeline
from gpuzarr_dist.config import deflate_check
from gpuzarr_dist.cuda.blosc_kernels import GATHER_SRC, SEGMENT, UNSHUFFLE_SRC, segments
from gpuzarr_dist.cuda.deflate import adler32_mismatches, deflate_suspects, warn_cpu_fallback
from gpuzarr_dist.cuda.deflate_walk import DEFLATE_ZLIB
from gpuzarr_dist.cuda.fallback import cpu_diagnose, judge_on_cpu
from gpuzarr_dist.cuda.launch import kernel
from gpuzarr_dist.cuda.lz4 import lz4_lengths
from gpuzarr_dist.cuda.nvcomp_calls import decode_spans
from gpuzarr_dist.cuda.steps import DeviceSteps, register
from gpuzarr_dist.cuda.streams import on_stream, upload
from gpuzarr_dist.cuda.zstd import NoStatedSize, zstd_frames
from gpuzarr_dist.errors import ChunkDecodeError
from gpuzarr_dist.runtime.once import warn_once
from gpuzarr_dist.runtime.stages import enabled as _stages_enabled
from gpuzarr_dist.runtime.stages import stage_timer

#: the largest stream nvCOMP's batched LZ4 and zstd decoders take (16 MiB)
MAX_STREAM = 1 << 24

_warned: set[str] = set()


def _warn_cpu(array: str, compressor: str) -> None:
    warn_once(_warned, compressor, f"{array}: blosc frames compressed with {compressor!r} have no GPU decoder; such "
              "chunks are decoded on the CPU and copied to the GPU once per block (warned once per compressor)",
              stacklevel=5)


def _grid(n: int) -> tuple[int]:
    return (max(1, min(n, 1 << 20)),)


def decode_blosc_batch(
    pipeline: CodecPipeline,
    host: np.ndarray,
    offsets: Sequence[int],
    sizes: Sequence[int],
    stored_sizes: Sequence[int],
    keys: Sequence[str],
    expected: int,
    stride: int,
    stream: cupy.cuda.Stream,
) -> cupy.ndarray | None:
    """Decode the Blosc frames of a batch into a device buffer, chunk ``i`` at ``i * stride``.

    ``sizes`` are the frames' sizes, ``stored_sizes`` the chunks' (with outer
    checksums, for decoding a failed chunk again on the CPU to name what is
    wrong). Returns ``None`` where the batch must be decoded on the CPU
    instead (frames of a compressor without a GPU decoder, streams nvCOMP
    cannot take or bound). Raises :class:`ChunkDecodeError` naming the chunk
    for malformed frames.
    """
    array = pipeline.array
    timed = stage_timer()  # sub-stages of "decode: blosc" (opt-in, see ..stages); GPU ones synchronise only then

    def mark(name: str) -> None:
        if _stages_enabled():
            stream.synchronize()
        timed(name)

    plan = bf.plan_frames(array, host, offsets, sizes, keys, expected, stride)
    if plan.unsupported:
        _warn_cpu(array, plan.unsupported)
        return None
    if plan.npieces and int(plan.piece_dsize.max()) > MAX_STREAM:
        return None  # larger than nvCOMP's batched decoders take (blosc blocks forced that large)
    n = len(keys)
    out = cupy.empty(max(n * stride, 1), dtype=cupy.uint8)
    if plan.nblocks == 0:
        return out
    in_total = max(int(o) + int(s) for o, s in zip(offsets, sizes))
    pl = bf.place(plan, in_total)
    comp = np.flatnonzero(plan.piece_codec != bf.RAW)
    seg_block, seg_start = segments(plan.block_size)
    timed("blosc: plan frames (host)")
    tables = [pl.gather_src, pl.gather_dst, pl.gather_len, pl.piece_at, plan.block_dst, plan.block_size,
              plan.block_piece0, plan.block_neblock, plan.block_typesize, plan.block_mode, seg_block, seg_start]
    with on_stream(stream):
        work = cupy.empty(pl.total, dtype=cupy.uint8)
        work[:in_total].set(host[:in_total], stream=stream)
        packed = upload(np.concatenate([np.asarray(t, dtype=np.int64) for t in tables]))
        views, at = [], 0
        for t in tables:
            views.append(packed[at : at + len(t)])
            at += len(t)
        gsrc, gdst, glen, piece_at, bdst, bsize, bpiece0, bneblock, bts, bmode, sblock, sstart = views
        mark("blosc: H2D")
        if comp.size:
            kernel("blosc_gather", GATHER_SRC)(_grid(comp.size), (256,), (work, gsrc, gdst, glen, np.int64(comp.size)))
            mark("blosc: gather")
            if not _decode_streams(pipeline, plan, pl, comp, work, host, offsets, stored_sizes, keys, stream,
                                   mark):
                stream.synchronize()
                return None
        kernel("blosc_unshuffle", UNSHUFFLE_SRC)(
            _grid(len(seg_block)), (256,),
            (work, out, piece_at, bdst, bsize, bpiece0, bneblock, bts, bmode, sblock, sstart,
             np.int64(len(seg_block)), np.int64(SEGMENT)),
        )
        stream.synchronize()  # ``work`` and the tables are freed on return
        timed("blosc: unshuffle")
    return out


def _decode_streams(pipeline: CodecPipeline, plan: bf.BloscPlan, pl: bf.Placement, comp: np.ndarray,
                    work: cupy.ndarray, host: np.ndarray, offsets: Sequence[int], sizes: Sequence[int],
                    keys: Sequence[str], stream: cupy.cuda.Stream, mark) -> bool:
    """Check, then decode the gathered streams: one batched nvCOMP call per inner codec.

    Returns ``False`` where the batch must go to the CPU (a zstd stream that
    states no decoded size, which nvCOMP cannot bound; c-blosc always states it;
    zlib streams that the deflate walk or the adler32 check flag and the CPU
    decoder accepts, such as bytes after a stream's end, which zlib ignores).
    Raises :class:`ChunkDecodeError` for the first chunk the CPU rejects.
    """
    array = pipeline.array
    codes = plan.piece_codec[comp]
    for code, algorithm in bf.GPU_FORMATS.items():
        sel = np.flatnonzero(codes == code)
        if sel.size == 0:
            continue
        pieces = comp[sel]
        in_offs, in_lens = pl.gather_dst[sel].tolist(), pl.gather_len[sel].tolist()
        dsize = plan.piece_dsize[pieces]
        piece_keys = [keys[c] for c in plan.piece_chunk[pieces]]
        name = bf.FORMATS[code]

        def judge(suspects: list[tuple[int, str]]) -> None:
            """Raise for the first chunk whose suspect stream the CPU rejects; return if it decodes them all."""
            by_chunk: dict[int, str] = {}
            for i, why in suspects:
                by_chunk.setdefault(int(plan.piece_chunk[pieces[i]]), why if why.startswith("blosc") else f"blosc zlib stream: {why}")
            judge_on_cpu(pipeline, host, offsets, sizes, keys, sorted(by_chunk.items()), "blosc")

        def diagnose(bad: np.ndarray, why: str) -> ChunkDecodeError:
            chunks = sorted({int(plan.piece_chunk[pieces[i]]) for i in bad})
            return cpu_diagnose(pipeline, host, [offsets[c] for c in chunks], [sizes[c] for c in chunks],
                                [keys[c] for c in chunks], f"blosc {name} stream: {why}", "blosc")

        if code == 1:  # nvCOMP decodes a malformed LZ4 block without an error: walk it first
            lengths = lz4_lengths(work, in_offs, in_lens, int(dsize.max()))
            bad = np.flatnonzero(lengths != dsize)
            if bad.size:
                raise diagnose(bad, f"malformed lz4 block (code {lengths[bad[0]]})")
        elif code == 4:  # zstd frames: magic, stated size and length checked on the device
            for want in np.unique(dsize):
                g = np.flatnonzero(dsize == want)
                try:
                    suspects = zstd_frames(array, work, [in_offs[i] for i in g], [in_lens[i] for i in g],
                                           [piece_keys[i] for i in g], int(want))
                except NoStatedSize:
                    return False
                except ChunkDecodeError as e:
                    raise ChunkDecodeError(array, e.key, f"blosc zstd stream: {e.reason}", "blosc") from None
                if suspects:  # impossible entropy structure: never handed to nvCOMP (it hung and faulted on such)
                    raise diagnose(g[[i for i, _ in suspects]], suspects[0][1])
        elif code == 3 and deflate_check() == "walk":  # nvCOMP's Deflate hangs on some damage: walk each stream
            suspects = deflate_suspects(work, plan.piece_src[pieces].tolist(), plan.piece_csize[pieces].tolist(), dsize,
                                        DEFLATE_ZLIB, stream)
            if suspects:  # never handed to nvCOMP: the CPU names a bad chunk or, accepting them all, decodes the batch
                judge(suspects)
                warn_cpu_fallback(array, suspects)
                return False
        mark(f"blosc: {name} walk")
        out_offs = pl.decode_at[pieces].tolist()
        out_caps = [int(bf._align(d)) for d in dsize.tolist()]
        try:
            actual = np.asarray(decode_spans(algorithm, stream, work, in_offs, in_lens, work, out_offs, out_caps),
                                dtype=np.int64)
        except (RuntimeError, ValueError, MemoryError) as e:
            raise diagnose(np.arange(sel.size), f"nvCOMP: {e}") from e
        mark(f"blosc: {name} nvCOMP")
        bad = np.flatnonzero(actual != dsize)
        if bad.size:
            raise diagnose(bad, f"decoded to {actual[bad[0]]} bytes, expected {dsize[bad[0]]}")
        if code == 3:  # the adler32 that the gather cut off: nvCOMP never sees it
            src_end = plan.piece_src[pieces] + plan.piece_csize[pieces]
            bad = adler32_mismatches(work, out_offs, dsize, host, src_end - 4, stream)
            if bad:
                judge([(i, "blosc zlib stream: adler32 checksum does not match the decoded data") for i in bad])
                return False
    return True


def _unsupported(codec) -> str | None:
    """``blosc (<cname>)`` for frames of a compressor without a GPU decoder (blosclz, snappy), else None."""
    cname = codec.config.get("cname", "lz4")
    if cname not in bf.GPU_CNAMES:  # blosclz, snappy: no GPU decoder
        return f"blosc ({cname})"
    return None


STEPS = register(DeviceSteps("blosc", kernels=("blosc_gather.cu", "blosc_unshuffle.cu", "lz4_check.cu", "zstd_frames.cu",
                                               "deflate_walk.cu", "adler32.cu"),
                             unsupported=_unsupported, decode=decode_blosc_batch))
