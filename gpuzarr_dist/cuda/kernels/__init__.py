"""The kernels' CUDA sources (``*.cu`` here, package data) and the zstd and checksum checks' constants.

The checks run on the device before nvCOMP decodes (no cupy needed to import).

nvCOMP trusts its input: a frame that lies about its sizes can make it write
outside its output slot or read past its input, and a structurally impossible
frame (a table "repeated" before any was defined, a literals section larger
than its block) has faulted the CUDA context in testing. The kernels here
walk each frame's headers, one thread per chunk, without decoding anything,
so such frames never reach nvCOMP. The sources are plain C apart from the
``__global__``/``__device__`` markers and the thread index, so the tests also
compile them with a host C++ compiler and run them on the CPU. Each source is
the text of its ``.cu`` file (:func:`..sources.source`).
"""

from __future__ import annotations

from gpuzarr_dist.cuda.sources import source

#: codes of :data:`ZSTD_FRAMES_SRC`'s ``deep`` output: why a frame that passed the header checks is suspect
ZSTD_DEEP_REASONS: dict[int, str] = {
    1: "zstd frame needs a dictionary",
    2: "zstd block is larger than the frame's block maximum (window size or 128 KiB)",
    3: "zstd compressed block is shorter than 2 bytes",
    4: "zstd literals section does not fit in its block",
    5: "zstd literals section regenerates more than the block maximum",
    6: "zstd treeless literals without a previous Huffman table",
    7: "zstd Huffman literals with an impossible tree description or jump table",
    8: "zstd sequences header does not fit in its block",
    9: "zstd block with no sequences has trailing bytes",
    10: "zstd sequences header has reserved bits set",
    11: "zstd sequences repeat a table that was never defined",
    12: "zstd blocks cannot regenerate the frame content size the header states",
    14: "zstd frame header has its reserved bit set",
    15: "zstd Huffman literal stream lacks its end marker (last byte zero)",
    16: "zstd sequences table description is invalid (accuracy log, counts or symbol out of range)",
    17: "zstd sequences bit stream is missing or lacks its end marker (last byte zero)",
    18: "zstd sequence copies more literals than its block holds",
    19: "zstd sequence offset reaches before the start of the frame",
    20: "zstd block's sequences regenerate more than the block maximum",
    21: "zstd sequences bit stream is not consumed exactly",
    22: "zstd Huffman literal stream is not consumed exactly (decoders disagree on such streams)",
}

#: bytes of :data:`ZSTD_FRAMES_SRC`'s ``gz_slot`` (one block of a frame in the parallel walk); a test checks it
ZSTD_SLOT_BYTES = 232

#: threads per CUDA block of the block walk's sequences (``zstd_blocks``), and how many of them keep their
#: tables in shared memory (about 10.4 KB each; the source's ``GZ_LANE_SHARED``), the others in local memory.
#: One thread a CUDA block with its tables in shared memory walks one batch as fast, but sixteen threads'
#: batches at once (copy, walk and nvCOMP) run about 7% faster with 128 threads a CUDA block and the tables
#: in local memory: fewer, fuller CUDA blocks leave more of each SM to nvCOMP.
ZSTD_BLOCK_THREADS = 128
ZSTD_LANE_SHARED = 0

#: blocks of a frame per CUDA block of the literals walk (``zstd_literals``, the source's ``GZ_LIT_SLOTS``):
#: four threads each, one per Huffman stream, sharing the block's 4 KiB decoding table in shared memory
#: (4: 16 KiB of shared memory a CUDA block, measured with the shape above)
ZSTD_LIT_SLOTS = 4

#: whether the literals walk runs on the thread's second stream (:func:`..streams.thread_side_stream`),
#: beside the sequences walk instead of after it: both need only the plan, and write other fields of a slot.
#: Beside it, the device stage of sixteen threads' batches runs about 19% faster.
#: Costs add up on the GPU: walk and nvCOMP do not overlap, copies do.
ZSTD_WALK_FORK = True


def zstd_block_slots(expected: int) -> int:
    """Block slots per frame in the block walk: twice the blocks a frame of ``expected`` bytes needs, and 4.

    A frame with more blocks (a window under 128 KiB, tiny blocks) is walked
    whole by one thread in ``zstd_combine`` instead, with the same verdict.
    """
    return 2 * (-(-max(expected, 1) // 131072)) + 4


#: ``gpuzarr.gpu.zstd-check`` values -> the ``mode`` argument of :data:`ZSTD_FRAMES_SRC`'s ``zstd_frames``
ZSTD_CHECK_MODES: dict[str, int] = {"headers": 0, "sequences": 1, "literals": 2}

ZSTD_FRAMES_SRC = source("zstd_frames.cu")


#: bytes of decoded data each thread of :data:`CRC32_SRC`'s ``crc32_segments`` checksums
CRC32_SEGMENT = 4096

CRC32_SRC = source("crc32.cu")

XXH64_SRC = source("xxh64.cu")
