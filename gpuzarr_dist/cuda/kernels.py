"""CUDA sources of the checks that run on the device before nvCOMP decodes (no cupy needed to import).

nvCOMP trusts its input: a frame that lies about its sizes can make it write
outside its output slot or read past its input, and a structurally impossible
frame (a table "repeated" before any was defined, a literals section larger
than its block) has faulted the CUDA context in testing. The kernels here
walk each frame's headers, one thread per chunk, without decoding anything,
so such frames never reach nvCOMP. The sources are plain C apart from the
``__global__``/``__device__`` markers and the thread index, so the tests also
compile them with a host C++ compiler and run them on the CPU.
"""

from __future__ import annotations

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
#: in local memory: fewer, fuller CUDA blocks leave more of
#: each SM to nvCOMP.
ZSTD_BLOCK_THREADS = 128
ZSTD_LANE_SHARED = 0

#: blocks of a frame per CUDA block of the literals walk (``zstd_literals``, the source's ``GZ_LIT_SLOTS``):
#: four threads each, one per Huffman stream, sharing the block's 4 KiB decoding table in shared memory
#: (4: 16 KiB of shared memory a CUDA block, measured with the shape above)
ZSTD_LIT_SLOTS = 4

#: whether the literals walk runs on the thread's second stream (:func:`..runtime.cuda.thread_side_stream`),
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

ZSTD_FRAMES_SRC = r"""
// RFC 8878 section numbers in the comments. Everything a frame's blocks carry to the next block
// (Huffman and FSE tables for "treeless" and "repeat" modes, repeat offsets, bytes regenerated).
// An FSE decoding table entry: the next state is base + the next nb bits. ``val`` is the symbol; in the
// sequence tables (after gz_seq_finish) it is the symbol's base value, with ``add`` extra bits to read.
struct gz_fse { unsigned int val; unsigned short base; unsigned char nb, add; };

struct gz_zstate {
    int seq_table;             // sequence tables were defined earlier in the frame (a Huffman table: huf_at >= 0)
    int al[3];                 // accuracy logs of the literal length, offset, match length tables
    long long rep[3];          // repeat offsets (3.1.2.5); in a block walk, relative to rs (below)
    long long out;             // bytes the frame regenerated before this block (sequences mode)
    gz_fse ll[512], of[256], ml[512];
    int huf_bits;              // literals mode: the Huffman table's maximum code length (0: none built)
    unsigned short* huf;       // literals mode: decoding table (gz_huf_tree), 2048 entries, the walker's own
    // The descriptions in force (offsets from the frame's start), kept up to date by every walk so that the
    // plan (zstd_plan) can hand each block its tables: the last Huffman tree description and, per sequence
    // table, its mode (0 predefined, 1 RLE, 2 FSE; -1 none yet) and description.
    const unsigned char* frame;
    long long huf_at, huf_len, tab_at[3], tab_len[3];
    int tab_mode[3];
    // A block walk (zstd_blocks) starts without the earlier blocks' state: ``lazy`` builds a repeated or
    // treeless table from the description in force when the block first needs it, ``rs[k]`` >= 0 says
    // rep[k] is relative to the block's initial repeat offset rs[k], and the offsets the block uses are
    // recorded (need_c, need, minv, relative to the block's start) for zstd_combine, not checked.
    int lazy, built[3], lane;  // lane: -1 the whole block; 4 all but the Huffman streams (zstd_literals walks those)
    int rs[3];
    long long need_c, need[3], minv[3];
};

#define GZ_NONE (-(1LL << 62))

__device__ int gz_highbit(unsigned long long v) { int b = 0; while (v >> (b + 1)) b++; return b; }

__device__ unsigned int gz_fwd_bits(const unsigned char* q, long long avail, long long bp, int n) {
    // n <= 16 bits at bit position bp of a forward bit stream (least significant bit first), zeros past its end
    unsigned int v = 0;
    long long byte = bp >> 3;
    for (int k = 0; k < 4; k++) if (byte + k < avail) v |= (unsigned int)q[byte + k] << (8 * k);
    return (v >> (bp & 7)) & ((1u << n) - 1);
}

__device__ unsigned long long gz_back_bits(const unsigned char* q, long long* pos, int n) {
    // n <= 32 bits below bit position *pos of a backward bit stream (4.1); bits below its start read as 0
    // and leave *pos negative, which the callers treat as corruption (libzstd's "overflow")
    if (n <= 0) return 0;
    long long start = *pos - n, first = start < 0 ? 0 : start, top = *pos;
    *pos = start;
    if (top <= first) return 0;
    long long byte = first >> 3;
    int sh = (int)(first & 7), need = (int)((top - first + sh + 7) >> 3);
    unsigned long long v = 0;
    for (int k = 0; k < need; k++) v |= (unsigned long long)q[byte + k] << (8 * k);
    v = (v >> sh) & ((1ULL << (top - first)) - 1);
    return v << (first - start);
}

// A backward bit stream (4.1) read through a 64-bit window: one refill of up to 8 bytes serves several
// reads, where gz_back_bits loads every byte it needs each time. Same values, same positions.
struct gz_bits { const unsigned char* q; long long pos, wlo; unsigned long long win; };

__device__ unsigned long long gz_window(const unsigned char* q, long long pos, long long* wlo) {
    // the up to 8 bytes ending with the one that holds bit pos - 1 (pos > 0), little-endian; *wlo: the
    // position of its lowest bit
    // The eight loads are independent (unrolled, predicated), so a refill waits for memory once, not
    // eight times in turn.
    long long top = (pos - 1) >> 3, sb = top > 7 ? top - 7 : 0;
    int n = (int)(top - sb) + 1;
    unsigned long long w = 0;
#ifdef __CUDA_ARCH__
#pragma unroll
#endif
    for (int k = 0; k < 8; k++)
        if (k < n) w |= (unsigned long long)q[sb + k] << (8 * k);
    *wlo = 8 * sb;
    return w;
}

__device__ void gz_bits_init(gz_bits* b, const unsigned char* q, long long pos) {
    b->q = q; b->pos = pos; b->wlo = pos + 1; b->win = 0;
}

__device__ unsigned int gz_bits_read(gz_bits* b, int n) {
    // the n <= 32 bits below b->pos, zeros below the stream's start; b->pos moves down by n
    long long pos = b->pos, lo = pos - n;
    if (n <= 0) return 0;
    b->pos = lo;
    if (pos <= 0) return 0;
    if (lo < b->wlo && b->wlo > 0) b->win = gz_window(b->q, pos, &b->wlo);
    if (lo >= b->wlo) return (unsigned int)((b->win >> (lo - b->wlo)) & ((1ULL << n) - 1));
    return (unsigned int)((b->win & ((1ULL << pos) - 1)) << (-lo));  // wlo == 0 and pos < n
}

__device__ long long gz_ncount(const unsigned char* q, long long avail, int maxs, int maxal, short* norm,
                               int* al_out, int* nsym_out) {
    // 4.1.1: an FSE table description. Returns the bytes it spans, or -1 when it is invalid (accuracy
    // log above maxal, a symbol above maxs, counts that do not sum to 1 << accuracy log, past avail).
    if (avail < 1) return -1;
    int al = (q[0] & 15) + 5;
    if (al > maxal) return -1;
    long long bp = 4;
    int remaining = (1 << al) + 1, threshold = 1 << al, nb = al + 1, s = 0, prev0 = 0;
    while (remaining > 1) {
        if (prev0) {  // 2-bit repeat flags of zero counts
            int rep;
            do {
                rep = (int)gz_fwd_bits(q, avail, bp, 2);
                bp += 2;
                for (int k = 0; k < rep; k++) { if (s > maxs) return -1; norm[s++] = 0; }
            } while (rep == 3 && bp <= 8 * avail);
        }
        if (s > maxs || bp > 8 * avail) return -1;
        int mx = (2 * threshold - 1) - remaining;
        int v = (int)gz_fwd_bits(q, avail, bp, nb), count;
        if ((v & (threshold - 1)) < mx) { count = v & (threshold - 1); bp += nb - 1; }
        else { count = v & (2 * threshold - 1); if (count >= threshold) count -= mx; bp += nb; }
        count--;  // -1: a "less than 1" probability
        remaining -= count < 0 ? -count : count;
        if (remaining < 1) return -1;
        norm[s++] = (short)count;
        prev0 = count == 0;
        while (remaining < threshold) { nb--; threshold >>= 1; }
    }
    if (bp > 8 * avail) return -1;
    *al_out = al; *nsym_out = s;
    return (bp + 7) >> 3;
}

__device__ void gz_fse_build(const short* norm, int nsym, int al, gz_fse* t) {
    // 4.1.1: the decoding table of a normalized distribution (counts sum to 1 << al, checked by gz_ncount)
    unsigned short next[256];
    int size = 1 << al, high = size - 1;
    for (int s = 0; s < nsym; s++) {
        if (norm[s] == -1) { t[high--].val = (unsigned int)s; next[s] = 1; }
        else next[s] = (unsigned short)(norm[s] > 0 ? norm[s] : 0);
    }
    int step = (size >> 1) + (size >> 3) + 3, pos = 0;
    for (int s = 0; s < nsym; s++)
        for (int k = 0; k < norm[s]; k++) {
            t[pos].val = (unsigned int)s;
            do pos = (pos + step) & (size - 1); while (pos > high);
        }
    for (int u = 0; u < size; u++) {
        unsigned int ns = next[t[u].val]++;
        int nb = al - gz_highbit(ns);
        t[u].nb = (unsigned char)nb;
        t[u].base = (unsigned short)((ns << nb) - size);
    }
}

__device__ long long gz_huf_tree_bytes(unsigned int hb) {
    // 4.2.1: the bytes of a Huffman tree description, from its first byte
    return hb >= 128 ? 1 + ((long long)hb - 127 + 1) / 2 : 1 + (long long)hb;
}

__device__ int gz_huf_tree(const unsigned char* q, long long avail, long long* used, unsigned short* huf,
                           int* huf_bits) {
    // 4.2.1: a Huffman tree description, weights decoded in full (at most 255 of them). Returns 0
    // when the weights make a complete prefix code of at most 11 bits, else 7; *used: its bytes.
    // With ``huf``, also builds its decoding table there, (symbol << 4) | code length by the next
    // *huf_bits bits (4.2.1.3: codes in order of increasing weight, then symbol, each taking
    // 2^(weight - 1) consecutive entries of the table).
    unsigned char w[256];
    int n = 0;
    if (avail < 1) return 7;
    unsigned int hb = q[0];
    if (hb >= 128) {  // 4-bit weights, stored directly
        n = (int)hb - 127;
        long long bytes = gz_huf_tree_bytes(hb) - 1;
        if (1 + bytes > avail) return 7;
        for (int k = 0; k < n; k++) { unsigned int b = q[1 + k / 2]; w[k] = (unsigned char)(k & 1 ? b & 15 : b >> 4); }
        *used = 1 + bytes;
    } else {  // FSE-compressed weights: a table (accuracy log <= 6) and a bit stream of two interleaved states
        long long cs = hb;
        if (1 + cs > avail) return 7;
        short norm[256];
        int al, nsym;
        long long nc = gz_ncount(q + 1, cs, 255, 6, norm, &al, &nsym);
        if (nc < 0 || nc >= cs) return 7;
        gz_fse t[64];
        gz_fse_build(norm, nsym, al, t);
        const unsigned char* bs = q + 1 + nc;
        long long bl = cs - nc;
        if (bs[bl - 1] == 0) return 7;
        long long pos = 8 * (bl - 1) + gz_highbit(bs[bl - 1]);
        int s1 = (int)gz_back_bits(bs, &pos, al), s2 = (int)gz_back_bits(bs, &pos, al);
        while (1) {
            if (n > 253) return 7;
            w[n++] = (unsigned char)t[s1].val;
            s1 = t[s1].base + (int)gz_back_bits(bs, &pos, t[s1].nb);
            if (pos < 0) { w[n++] = (unsigned char)t[s2].val; break; }
            if (n > 253) return 7;
            w[n++] = (unsigned char)t[s2].val;
            s2 = t[s2].base + (int)gz_back_bits(bs, &pos, t[s2].nb);
            if (pos < 0) { w[n++] = (unsigned char)t[s1].val; break; }
        }
        *used = 1 + cs;
    }
    long long sum = 0;
    int rank1 = 0;
    for (int k = 0; k < n; k++) {
        if (w[k] > 11) return 7;
        if (w[k]) sum += 1LL << (w[k] - 1);
        rank1 += w[k] == 1;
    }
    if (sum == 0) return 7;
    int maxbits = gz_highbit(sum) + 1;
    if (maxbits > 11) return 7;
    long long rest = (1LL << maxbits) - sum;  // the last symbol's weight is implied: rest must be a power of 2
    if (rest & (rest - 1)) return 7;
    rank1 += gz_highbit(rest) == 0;
    if (rank1 < 2 || (rank1 & 1)) return 7;  // a complete code has an even number (>= 2) of longest codes
    if (huf) {
        w[n++] = (unsigned char)(gz_highbit(rest) + 1);  // the last symbol's implied weight
        int at = 0;
        for (int wt = 1; wt <= maxbits; wt++)
            for (int k = 0; k < n; k++)
                if (w[k] == wt) {
                    unsigned short e = (unsigned short)((k << 4) | (maxbits + 1 - wt));
                    for (int r = 0; r < (1 << (wt - 1)); r++) huf[at++] = e;
                }
        *huf_bits = at == (1 << maxbits) ? maxbits : 0;
        if (!*huf_bits) return 7;
    }
    return 0;
}

__device__ int gz_huf_stream(const unsigned char* bs, long long bl, long long count, const unsigned short* tab, int mb) {
    // 4.2.2: decode ``count`` literals of one Huffman stream (no output is written) and check that they
    // use its bits exactly: a stream read past its start, or with bits left over, is corrupt, and decoders
    // differ on what such a stream holds (libzstd's fast path reads the bytes before it). Returns 0 or 22.
    if (bl < 1 || bs[bl - 1] == 0) return 15;
    long long pos = 8 * (bl - 1) + gz_highbit(bs[bl - 1]);
    // A window of the bits [wlo, pos) left-aligned in 64 bits: each literal is the window's top mb bits,
    // shifted out by its code length, zeros shifting in (below the stream's start, where wlo is 0). pos only
    // decreases, so reading past the start anywhere leaves it negative at the end: one check suffices.
    long long k = 0;
    while (k < count) {
        if (pos <= 0) return 22;  // literals left and no bits
        long long wlo;
        unsigned long long w = gz_window(bs, pos, &wlo);
        int have = (int)(pos - wlo);  // bits of the window below pos (1 to 64)
        if (have < 64) w <<= 64 - have;
        int used = 0;
        if (wlo > 0) {  // more bytes below: decode while the window holds a whole peek
            while (k < count && have - used >= mb) {
                int n = tab[(unsigned int)(w >> (64 - mb))] & 15;
                w <<= n; used += n; k++;
            }
        } else {  // the stream's first bytes: zeros below them, no refill left
            while (k < count && used <= have) {
                int n = tab[(unsigned int)(w >> (64 - mb))] & 15;
                w <<= n; used += n; k++;
            }
            if (k < count) return 22;  // read past the start with literals left
        }
        pos -= used;
    }
    return pos == 0 ? 0 : 22;
}

// 3.1.1.3.2.2: predefined distributions; 3.1.1.3.2.1.1: literal length and match length codes
__device__ const short gz_ll_def[36] = {4, 3, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 1, 1, 1, 2, 2, 2, 2, 2, 2, 2, 2,
                                        2, 3, 2, 1, 1, 1, 1, 1, -1, -1, -1, -1};
__device__ const short gz_ml_def[53] = {1, 4, 3, 2, 2, 2, 2, 2, 2, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1,
                                        1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, -1, -1,
                                        -1, -1, -1, -1, -1};
__device__ const short gz_of_def[29] = {1, 1, 1, 1, 1, 1, 2, 2, 2, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1,
                                        -1, -1, -1, -1, -1};
__device__ const int gz_ll_base[36] = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 18, 20, 22, 24, 28,
                                       32, 40, 48, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768, 65536};
__device__ const unsigned char gz_ll_bits[36] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 2, 2,
                                                 3, 3, 4, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16};
__device__ const int gz_ml_base[53] = {3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23,
                                       24, 25, 26, 27, 28, 29, 30, 31, 32, 33, 34, 35, 37, 39, 41, 43, 47, 51, 59,
                                       67, 83, 99, 131, 259, 515, 1027, 2051, 4099, 8195, 16387, 32771, 65539};
__device__ const unsigned char gz_ml_bits[53] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
                                                 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 3, 3, 4, 4, 5, 7,
                                                 8, 9, 10, 11, 12, 13, 14, 15, 16};

__device__ void gz_seq_finish(gz_fse* t, int size, int kind) {
    // 3.1.1.3.2.1.1: a sequence table's symbols (codes) become their base values and extra bit counts
    for (int u = 0; u < size; u++) {
        unsigned int c = t[u].val;
        if (kind == 1) { t[u].add = (unsigned char)c; t[u].val = 1u << c; }
        else if (kind == 0) { t[u].add = gz_ll_bits[c]; t[u].val = (unsigned int)gz_ll_base[c]; }
        else { t[u].add = gz_ml_bits[c]; t[u].val = (unsigned int)gz_ml_base[c]; }
    }
}

__device__ int gz_seq_build(const unsigned char* q, long long avail, int mode, int kind, int build,
                            gz_zstate* st, long long* used) {
    // 3.1.1.3.2.2: one sequence table description (kind 0 literal lengths, 1 offsets, 2 match lengths) in
    // mode 0 (predefined), 1 (RLE) or 2 (FSE). Returns 0 or a ZSTD_DEEP_REASONS code; builds the decoding
    // table when ``build``.
    const int maxs = kind == 0 ? 35 : (kind == 1 ? 31 : 52), maxal = kind == 1 ? 8 : 9;
    gz_fse* t = kind == 0 ? st->ll : (kind == 1 ? st->of : st->ml);
    *used = 0;
    if (mode == 0) {  // predefined
        if (build) {
            const short* d = kind == 0 ? gz_ll_def : (kind == 1 ? gz_of_def : gz_ml_def);
            int al = kind == 1 ? 5 : 6;
            gz_fse_build(d, kind == 0 ? 36 : (kind == 1 ? 29 : 53), al, t);
            gz_seq_finish(t, 1 << al, kind);
            st->al[kind] = al;
        }
    } else if (mode == 1) {  // RLE: one symbol
        if (avail < 1) return 8;
        if (q[0] > maxs) return 16;
        t[0].val = q[0]; t[0].nb = 0; t[0].base = 0;
        gz_seq_finish(t, 1, kind);
        st->al[kind] = 0;
        *used = 1;
    } else {  // FSE-compressed table description
        short norm[64];
        int al, nsym;
        long long nc = gz_ncount(q, avail, maxs, maxal, norm, &al, &nsym);
        if (nc < 0) return 16;
        if (build) { gz_fse_build(norm, nsym, al, t); gz_seq_finish(t, 1 << al, kind); st->al[kind] = al; }
        *used = nc;
    }
    return 0;
}

__device__ int gz_seq_table(const unsigned char* q, long long avail, int mode, int kind, int build,
                            gz_zstate* st, long long* used) {
    // A sequence table in any mode: gz_seq_build's, and mode 3 (repeat the table in force). Keeps the
    // description in force up to date; a block walk builds a repeated table from it (st->lazy).
    *used = 0;
    if (mode == 3) {
        if (!st->seq_table) return 11;
        if (build && st->lazy && !st->built[kind]) {
            long long u;
            if (gz_seq_build(st->frame + st->tab_at[kind], st->tab_len[kind], st->tab_mode[kind], kind, 1, st, &u))
                return 16;
            st->built[kind] = 1;
        }
        return 0;
    }
    int bad = gz_seq_build(q, avail, mode, kind, build, st, used);
    if (bad) return bad;
    st->tab_mode[kind] = mode; st->tab_at[kind] = q - st->frame; st->tab_len[kind] = avail;
    st->built[kind] = build;
    return 0;
}

__device__ int gz_sequences(const unsigned char* bs, long long bl, long long nseq, long long lit, long long bmax,
                            gz_zstate* st, long long* regenerated) {
    // 3.1.1.3.2.2 - 3.1.1.4: decode every sequence's codes and extra bits (no output is written) and check
    // that literal lengths stay within the block's literals, offsets within the bytes the frame has
    // regenerated, the block within its maximum, and that the bit stream is consumed exactly.
    gz_bits b;
    gz_bits_init(&b, bs, 8 * (bl - 1) + gz_highbit(bs[bl - 1]));
    int sll = (int)gz_bits_read(&b, st->al[0]);
    int sof = (int)gz_bits_read(&b, st->al[1]);
    int sml = (int)gz_bits_read(&b, st->al[2]);
    long long litleft = lit, bout = 0;
    for (long long k = 0; k < nseq; k++) {
        if (b.pos < 0) return 21;
        const gz_fse eo = st->of[sof], el = st->ll[sll], em = st->ml[sml];
        long long ofv = (long long)eo.val + (long long)gz_bits_read(&b, eo.add);
        unsigned int x = gz_bits_read(&b, em.add + el.add);  // match length extra bits, then literal length's
        long long mlv = (long long)em.val + (long long)(el.add ? x >> el.add : x);
        long long llv = (long long)el.val + (long long)(x & ((1u << el.add) - 1));
        long long off;  // the offset, relative to the block's initial repeat offset os (-1: absolute)
        int os;
        if (ofv > 3) {
            off = ofv - 3; os = -1;
            st->rep[2] = st->rep[1]; st->rep[1] = st->rep[0]; st->rep[0] = off;
            st->rs[2] = st->rs[1]; st->rs[1] = st->rs[0]; st->rs[0] = -1;
        } else {
            int idx = (int)ofv - 1 + (llv == 0);
            if (idx == 0) { off = st->rep[0]; os = st->rs[0]; }
            else {
                off = idx == 3 ? st->rep[0] - 1 : st->rep[idx];
                os = idx == 3 ? st->rs[0] : st->rs[idx];
                if (idx != 1) { st->rep[2] = st->rep[1]; st->rs[2] = st->rs[1]; }
                st->rep[1] = st->rep[0]; st->rs[1] = st->rs[0];
                st->rep[0] = off; st->rs[0] = os;
            }
        }
        if (llv > litleft) return 18;
        litleft -= llv;
        bout += llv;
        if (os < 0 && !st->lazy) {
            if (off <= 0 || off > st->out + bout) return 19;
        } else if (os < 0) {  // a block walk: off <= (bytes before the block) + bout, checked by zstd_combine
            if (off <= 0) return 19;
            if (off - bout > st->need_c) st->need_c = off - bout;
        } else {  // R[os] + off must be > 0 and <= (bytes before the block) + bout
            if (off - bout > st->need[os]) st->need[os] = off - bout;
            if (off < st->minv[os]) st->minv[os] = off;
        }
        bout += mlv;
        if (bout > bmax) return 20;
        if (k + 1 < nseq) {  // state updates: literal lengths, match lengths, offsets, in one read
            unsigned int u = gz_bits_read(&b, el.nb + em.nb + eo.nb);
            sof = eo.base + (int)(u & ((1u << eo.nb) - 1));
            sml = em.base + (int)((u >> eo.nb) & ((1u << em.nb) - 1));
            sll = el.base + (int)(u >> (eo.nb + em.nb));
        }
    }
    if (b.pos != 0) return 21;
    *regenerated = bout + litleft;
    return 0;
}

__device__ int gz_lit_header(const unsigned char* q, long long bsize, long long bmax, int* ltype, int* sf,
                             long long* lh, long long* lit, long long* lcs) {
    // 3.1.1.3.1.1: a compressed block's literals section header: its type (0 raw, 1 RLE, 2 Huffman with a
    // tree description, 3 treeless), size format, header bytes, literals regenerated and bytes the section
    // spans after its header (a Huffman section's regenerated size is checked later, by the callers).
    // Returns 0 when the section fits in its block, else a ZSTD_DEEP_REASONS code.
    if (bsize < 2) return 3;
    unsigned int b0 = q[0];
    *ltype = b0 & 3; *sf = (b0 >> 2) & 3;
    if (*ltype < 2) {  // raw or RLE literals
        if (*sf == 1) { *lh = 2; *lit = (b0 >> 4) + ((long long)q[1] << 4); }
        else if (*sf == 3) { *lh = 3; if (bsize < 3) return 4; *lit = (b0 >> 4) + ((long long)q[1] << 4) + ((long long)q[2] << 12); }
        else { *lh = 1; *lit = b0 >> 3; }
        *lcs = *ltype == 0 ? *lit : 1;
        if (*lh + *lcs > bsize) return 4;
        if (*lit > bmax) return 5;
        return 0;
    }
    *lh = *sf < 2 ? 3 : *sf + 2;
    if (*lh > bsize) return 4;
    unsigned long long lhc = (unsigned long long)q[0] | ((unsigned long long)q[1] << 8) | ((unsigned long long)q[2] << 16);
    if (*lh > 3) lhc |= (unsigned long long)q[3] << 24;
    if (*lh == 3) { *lit = (lhc >> 4) & 0x3FF; *lcs = (lhc >> 14) & 0x3FF; }
    else if (*lh == 4) { *lit = (lhc >> 4) & 0x3FFF; *lcs = (long long)(lhc >> 18); }
    else { *lit = (lhc >> 4) & 0x3FFFF; *lcs = (long long)(lhc >> 22) + ((long long)q[4] << 10); }
    if (*lh + *lcs > bsize) return 4;
    return 0;
}

__device__ int gz_huf_streams(const unsigned char* hs, long long rest, int four, long long* at, long long* len) {
    // 3.1.1.3.1.6: where a Huffman literals section's streams are, after its tree description (hs, rest
    // bytes): one stream, or four behind a 6-byte jump table. Returns 0, 7 (an impossible jump table) or 15
    // (a stream without its end marker).
    if (!four) {
        if (rest < 1) return 7;
        if (!hs[rest - 1]) return 15;
        at[0] = 0; len[0] = rest;
        return 0;
    }
    if (rest < 10) return 7;
    long long s1 = hs[0] | (hs[1] << 8), s2 = hs[2] | (hs[3] << 8), s3 = hs[4] | (hs[5] << 8);
    if (s1 < 1 || s2 < 1 || s3 < 1 || s1 + s2 + s3 + 6 >= rest) return 7;
    if (!hs[5 + s1] || !hs[5 + s1 + s2] || !hs[5 + s1 + s2 + s3] || !hs[rest - 1]) return 15;
    at[0] = 6; len[0] = s1;
    at[1] = 6 + s1; len[1] = s2;
    at[2] = 6 + s1 + s2; len[2] = s3;
    at[3] = 6 + s1 + s2 + s3; len[3] = rest - 6 - s1 - s2 - s3;
    return 0;
}

__device__ int zstd_compressed_block(const unsigned char* q, long long bsize, long long bmax, int mode,
                                     gz_zstate* st, long long* lo, long long* hi) {
    // 3.1.1.3: a compressed block's literals section (header, Huffman tree description, stream sizes and
    // end markers; with mode 2 every literal) and sequences section (header, table descriptions, bit stream
    // end marker; with mode >= 1 the sequences themselves). Returns 0 when consistent, else a
    // ZSTD_DEEP_REASONS code. A block walk's lane 4 checks everything but the Huffman streams, which
    // zstd_literals walks.
    int walk_lits = mode >= 2 && st->lane < 0, ltype, sf;
    long long lh, lit, lcs;
    int bad = gz_lit_header(q, bsize, bmax, &ltype, &sf, &lh, &lit, &lcs);
    if (bad) return bad;
    if (ltype >= 2) {  // Huffman-coded literals (2: with a tree description, 3: treeless)
        int four = sf != 0;
        if (four && lit < 6) return 7;
        if (ltype == 3 && st->huf_at < 0) return 6;
        long long tree = 0;
        if (ltype == 2) {
            if (lcs < 1) return 7;
            bad = gz_huf_tree(q + lh, lcs, &tree, walk_lits ? st->huf : 0, &st->huf_bits);
            if (bad) return bad;
            if (tree >= lcs) return 7;
            st->huf_at = q + lh - st->frame; st->huf_len = lcs;
        }
        long long at[4], len[4];
        bad = gz_huf_streams(q + lh + tree, lcs - tree, four, at, len);
        if (bad) return bad;
        if (lit > bmax) return 5;
        if (walk_lits && st->huf_bits) {  // 4.2.2: each stream regenerates its share exactly
            long long per = (lit + 3) / 4;
            for (int k = 0; k < (four ? 4 : 1) && !bad; k++)
                bad = gz_huf_stream(q + lh + tree + at[k], len[k], four ? (k < 3 ? per : lit - 3 * per) : lit,
                                    st->huf, st->huf_bits);
            if (bad) return bad;
        }
    }
    long long pos = lh + lcs;
    if (pos >= bsize) return 8;
    unsigned int s0 = q[pos++];
    long long nseq = s0;
    if (s0 == 255) { if (pos + 2 > bsize) return 8; nseq = (long long)q[pos] + ((long long)q[pos + 1] << 8) + 0x7F00; pos += 2; }
    else if (s0 >= 128) { if (pos + 1 > bsize) return 8; nseq = (((long long)s0 - 128) << 8) + q[pos]; pos += 1; }
    if (nseq == 0) {
        if (pos != bsize) return 9;
        *lo += lit; *hi += lit;
        st->out += lit;
        return 0;
    }
    if (pos + 1 > bsize) return 8;
    unsigned int modes = q[pos++];
    if (modes & 3) return 10;
    for (int kind = 0; kind < 3; kind++) {  // literal lengths, offsets, match lengths
        long long used;
        int bad = gz_seq_table(q + pos, bsize - pos, (modes >> (6 - 2 * kind)) & 3, kind, mode, st, &used);
        if (bad) return bad;
        pos += used;
    }
    st->seq_table = 1;
    if (pos >= bsize || q[bsize - 1] == 0) return 17;
    if (mode) {
        long long regenerated;
        int bad = gz_sequences(q + pos, bsize - pos, nseq, lit, bmax, st, &regenerated);
        if (bad) return bad;
        *lo += regenerated; *hi += regenerated;
        st->out += regenerated;
    } else {
        *lo += lit; *hi += bmax;
    }
    return 0;
}

#ifndef GZ_LANE_SHARED
#define GZ_LANE_SHARED 1  // zstd_blocks: threads of a CUDA block whose walk state is in shared memory
#endif

// A block of a frame, as the plan (zstd_plan) hands it to the block walks (zstd_blocks) and they to the
// frame's combine (zstd_combine); 64-bit fields first, so that host and device agree on its size (ZSTD_SLOT_BYTES).
struct gz_slot {
    long long at, size, bmax;           // the block's content (offset from the frame's start), its block maximum
    long long known;                    // bytes a raw or RLE block regenerates; -1: a compressed block, walked
    long long huf_at, huf_len;          // the Huffman tree description in force before the block
    long long tab_at[3], tab_len[3];    // the sequence table descriptions in force before the block
    long long regen;                    // out: bytes the block regenerates
    long long need_c, need[3], minv[3]; // out: the offsets it uses (gz_zstate)
    long long rv[3];                    // out: its last repeat offsets, relative to rs
    int tab_mode[3];
    int code[5];                        // out: each lane's verdict (0 or a ZSTD_DEEP_REASONS code)
    int rs[3];
};

__device__ void gz_state_init(gz_zstate* st, const unsigned char* frame) {
    st->seq_table = 0; st->out = 0; st->huf_bits = 0; st->huf = 0;
    st->rep[0] = 1; st->rep[1] = 4; st->rep[2] = 8;
    st->rs[0] = st->rs[1] = st->rs[2] = -1;
    st->al[0] = st->al[1] = st->al[2] = 0;
    st->frame = frame; st->huf_at = -1; st->huf_len = 0;
    for (int k = 0; k < 3; k++) {
        st->tab_at[k] = -1; st->tab_len[k] = 0; st->tab_mode[k] = -1; st->built[k] = 0;
        st->need[k] = GZ_NONE; st->minv[k] = -GZ_NONE;
    }
    st->need_c = GZ_NONE;
    st->lazy = 0; st->lane = -1;
}

__device__ void gz_frame_walk(const unsigned char* p, long long len, int mode, gz_slot* slots, int cap,
                              long long* fcs_out, long long* len_out, int* deep_out, int* nslots) {
    // A zstd frame's header (RFC 8878 3.1.1) and its blocks, in order, by one thread.
    // fcs_out: the decoded size the frame states (-1 none, -2 not zstd, -3 header cut).
    // len_out: the bytes the frame spans (-4 reserved block type).
    // deep_out: 0, or why the blocks are structurally impossible (ZSTD_DEEP_REASONS).
    // mode: 0 checks block headers, literals and sequences headers, tables and stream end markers;
    // 1 also decodes every sequence; 2 also decodes every Huffman-coded literal (ZSTD_CHECK_MODES).
    // With ``slots`` (the plan): mode 0's checks, and every block up to the first bad one recorded for
    // zstd_blocks; *nslots is their number, -1 past ``cap`` blocks, -2 where there is nothing to combine.
    *fcs_out = -2; *len_out = -1; *deep_out = 0;
    if (slots) { *nslots = -2; mode = 0; }
    if (len < 6) return;
    unsigned int magic = p[0] | (p[1] << 8) | (p[2] << 16) | ((unsigned int)p[3] << 24);
    if (magic != 0xFD2FB528u) return;
    unsigned int desc = p[4];
    int single = (desc >> 5) & 1, dflag = desc & 3, fflag = desc >> 6, cks = (desc >> 2) & 1;
    int fsz = fflag == 0 ? single : (fflag == 1 ? 2 : (fflag == 2 ? 4 : 8));
    int dsz = dflag == 3 ? 4 : dflag;
    long long pos = 5, window = -1;
    if (!single) {
        unsigned int wd = p[5];
        long long base = 1LL << (10 + (wd >> 3));
        window = base + (base / 8) * (wd & 7);
        pos = 6;
    }
    if (pos + dsz + fsz > len) { *fcs_out = -3; return; }
    unsigned long long dict = 0;
    for (int k = 0; k < dsz; k++) dict |= ((unsigned long long)p[pos + k]) << (8 * k);
    pos += dsz;
    long long fcs = -1;
    if (fsz) {
        fcs = 0;
        for (int k = 0; k < fsz; k++) fcs |= ((long long)p[pos + k]) << (8 * k);
        if (fsz == 2) fcs += 256;
    }
    *fcs_out = fcs;
    pos += fsz;
    int deep = (desc & 8) ? 14 : (dict ? 1 : 0);
    long long wsize = single ? fcs : window;
    long long bmax = (wsize >= 0 && wsize < 131072) ? wsize : 131072;
    long long lo = 0, hi = 0;
    int ns = 0;
    gz_zstate st;
    unsigned short huf[2048];
    gz_state_init(&st, p);
    st.huf = huf;
    while (1) {
        if (pos + 3 > len) { *len_out = pos + 3; break; }
        unsigned int h = p[pos] | (p[pos + 1] << 8) | (p[pos + 2] << 16);
        pos += 3;
        unsigned int kind = (h >> 1) & 3;
        long long bsize = h >> 3;
        if (kind == 3) { *len_out = -4; return; }
        long long end = pos + (kind == 1 ? 1 : bsize);
        if (!deep) {
            gz_slot* s = 0;
            if (slots && (kind < 2 || end <= len) && bsize <= bmax) {
                if (ns == cap) ns = -1;  // too many blocks: zstd_combine walks this frame itself
                if (ns >= 0) {
                    s = slots + ns++;
                    s->at = pos; s->size = bsize; s->bmax = bmax; s->known = kind < 2 ? bsize : -1;
                    s->huf_at = st.huf_at; s->huf_len = st.huf_len;
                    for (int k = 0; k < 3; k++) { s->tab_at[k] = st.tab_at[k]; s->tab_len[k] = st.tab_len[k]; s->tab_mode[k] = st.tab_mode[k]; }
                    for (int k = 0; k < 5; k++) s->code[k] = 0;
                }
            }
            if (bsize > bmax) deep = 2;
            else if (kind < 2) { lo += bsize; hi += bsize; st.out += bsize; }
            else if (end <= len) deep = zstd_compressed_block(p + pos, bsize, bmax, mode, &st, &lo, &hi);
            // the plan stops at the first bad block, which keeps its slot: its lanes may find an earlier fault
        }
        pos = end;
        if (h & 1) { *len_out = pos + 4 * cks; break; }
    }
    if (slots) { *nslots = ns; *deep_out = deep; return; }  // zstd_combine checks the frame's size
    if (!deep && fcs >= 0 && *len_out <= len && (lo > fcs || hi < fcs)) deep = 12;
    *deep_out = deep;
}

extern "C" __global__ void zstd_frames(const unsigned char* src, const long long* offs, const long long* sizes,
                                       int n, long long* fcs_out, long long* len_out, int* deep_out, int mode) {
    // One thread walks one zstd frame (gz_frame_walk), all its blocks in order.
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    gz_frame_walk(src + offs[i], sizes[i], mode, 0, 0, fcs_out + i, len_out + i, deep_out + i, 0);
}

// The same verdicts as zstd_frames in mode 1 or 2, with the sequences and literals of every block walked by
// threads of their own: zstd_plan (a thread per frame: headers, tables, the block list), zstd_blocks (a
// thread per block: its sequences), zstd_literals (mode 2: a thread per Huffman stream), zstd_combine (a
// thread per frame: the blocks' verdicts in order, offsets against the bytes before each block, the frame's
// size). The same stream runs all four.
extern "C" __global__ void zstd_plan(const unsigned char* src, const long long* offs, const long long* sizes, int n,
                                     gz_slot* slots, int cap, int* nslots, long long* fcs_out, long long* len_out,
                                     int* deep_out) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    gz_frame_walk(src + offs[i], sizes[i], 0, slots + (long long)i * cap, cap, fcs_out + i, len_out + i,
                  deep_out + i, nslots + i);
}

extern "C" __global__ void zstd_blocks(const unsigned char* src, const long long* offs, int n, gz_slot* slots,
                                       int cap, const int* nslots, int mode) {
    // A thread per block of a frame (the plan's slots): everything but the Huffman streams (lane 4).
    long long j = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    int i = (int)(j / cap), k = (int)(j % cap);
    if (i >= n || k >= nslots[i]) return;
    gz_slot* s = slots + j;
    if (s->known >= 0) return;
    // The walk's tables are looked up three times per sequence: the first GZ_LANE_SHARED threads of a CUDA
    // block keep their state in shared memory, the others in local memory.
#if GZ_LANE_SHARED > 0
    __shared__ gz_zstate shared_st[GZ_LANE_SHARED];
    gz_zstate local_st;
    gz_zstate* st = threadIdx.x < GZ_LANE_SHARED ? shared_st + threadIdx.x : &local_st;
#else
    gz_zstate local_st;
    gz_zstate* st = &local_st;
#endif
    gz_state_init(st, src + offs[i]);
    st->lazy = 1; st->lane = 4;
    st->seq_table = s->tab_mode[0] >= 0;
    st->rep[0] = st->rep[1] = st->rep[2] = 0;
    st->rs[0] = 0; st->rs[1] = 1; st->rs[2] = 2;
    st->huf_at = s->huf_at; st->huf_len = s->huf_len;
    for (int q = 0; q < 3; q++) { st->tab_at[q] = s->tab_at[q]; st->tab_len[q] = s->tab_len[q]; st->tab_mode[q] = s->tab_mode[q]; }
    long long lo = 0, hi = 0;
    s->code[4] = zstd_compressed_block(st->frame + s->at, s->size, s->bmax, mode, st, &lo, &hi);
    s->regen = lo; s->need_c = st->need_c;
    for (int q = 0; q < 3; q++) { s->need[q] = st->need[q]; s->minv[q] = st->minv[q]; s->rv[q] = st->rep[q]; s->rs[q] = st->rs[q]; }
}

#ifndef GZ_LIT_SLOTS
#define GZ_LIT_SLOTS 8  // zstd_literals: blocks of a frame per CUDA block (4 threads and one 4 KiB table each)
#endif

extern "C" __global__ void zstd_literals(const unsigned char* src, const long long* offs, int n, gz_slot* slots,
                                         int cap, const int* nslots) {
    // Mode 2's Huffman streams (4.2.2), four threads per block of a frame (launched with 4 * GZ_LIT_SLOTS
    // threads per CUDA block): the first builds the block's decoding table in shared memory, then each walks
    // its stream with it (gz_huf_stream) and writes its verdict to code[0-3]. A literals section that is
    // not Huffman-coded, or is malformed, is left to zstd_blocks, which checks everything else about it.
    __shared__ unsigned short tabs[GZ_LIT_SLOTS][2048];
    __shared__ int bits[GZ_LIT_SLOTS];
    long long j = ((long long)blockIdx.x * blockDim.x + threadIdx.x) >> 2;
    int lane = (int)(threadIdx.x & 3), ls = (int)(threadIdx.x >> 2);
    int i = (int)(j / cap), k = (int)(j % cap), ltype = -1, sf = 0, streams = 0;
    gz_slot* s = i < n && k < nslots[i] ? slots + j : 0;
    const unsigned char* q = 0;
    long long lh = 0, lit = 0, lcs = 0, tree = 0, at[4], len[4];
    if (s && s->known < 0) {
        q = src + offs[i] + s->at;
        if (gz_lit_header(q, s->size, s->bmax, &ltype, &sf, &lh, &lit, &lcs) || ltype < 2 || lit > s->bmax
            || (sf != 0 && lit < 6) || (ltype == 3 && s->huf_at < 0) || lcs < 1) ltype = -1;
        if (ltype == 2) tree = gz_huf_tree_bytes(q[lh]);
        if (ltype >= 2 && (tree >= lcs || gz_huf_streams(q + lh + tree, lcs - tree, sf != 0, at, len))) ltype = -1;
        if (ltype >= 2) streams = sf != 0 ? 4 : 1;
    }
    if (lane == 0) {
        bits[ls] = 0;
        if (streams) {
            const unsigned char* d = ltype == 2 ? q + lh : src + offs[i] + s->huf_at;
            long long u;
            int bad = gz_huf_tree(d, ltype == 2 ? lcs : s->huf_len, &u, tabs[ls], &bits[ls]);
            if (bad) { bits[ls] = 0; s->code[0] = bad; }
        }
    }
    __syncthreads();
    if (lane >= streams || !bits[ls]) return;
    long long per = (lit + 3) / 4;
    int code = gz_huf_stream(q + lh + tree + at[lane], len[lane], streams == 1 ? lit : (lane < 3 ? per : lit - 3 * per),
                             tabs[ls], bits[ls]);
    if (code) s->code[lane] = code;
}

extern "C" __global__ void zstd_combine(const unsigned char* src, const long long* offs, const long long* sizes,
                                        int n, const gz_slot* slots, int cap, const int* nslots, long long* fcs_out,
                                        long long* len_out, int* deep_out, int mode) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    int ns = nslots[i];
    if (ns == -2) return;  // the plan's verdict stands (not zstd, header cut, reserved block type)
    if (ns < 0) {  // more blocks than the plan had room for: walk the frame here
        gz_frame_walk(src + offs[i], sizes[i], mode, 0, 0, fcs_out + i, len_out + i, deep_out + i, 0);
        return;
    }
    const gz_slot* s = slots + (long long)i * cap;
    long long out = 0, rep[3] = {1, 4, 8};
    for (int j = 0; j < ns; j++, s++) {
        if (s->known >= 0) { out += s->known; continue; }
        int code = 0;
        for (int q = 0; q < 5 && !code; q++) code = s->code[q];
        if (!code && s->need_c != GZ_NONE && s->need_c > out) code = 19;
        for (int q = 0; q < 3 && !code; q++)
            if (s->need[q] != GZ_NONE && (rep[q] + s->minv[q] <= 0 || rep[q] + s->need[q] > out)) code = 19;
        if (code) { deep_out[i] = code; return; }
        out += s->regen;
        long long r[3];
        for (int q = 0; q < 3; q++) r[q] = s->rs[q] < 0 ? s->rv[q] : rep[s->rs[q]] + s->rv[q];
        for (int q = 0; q < 3; q++) rep[q] = r[q];
    }
    long long fcs = fcs_out[i];
    if (!deep_out[i] && fcs >= 0 && len_out[i] <= sizes[i] && out != fcs) deep_out[i] = 12;
}
"""


#: bytes of decoded data each thread of :data:`CRC32_SRC`'s ``crc32_segments`` checksums
CRC32_SEGMENT = 4096

CRC32_SRC = r"""
// CRC-32 (gzip's checksum, reflected polynomial 0xEDB88320) of many equal-sized buffers:
// crc32_segments gives each thread one segment of a buffer; crc32_combine joins
// a buffer's segment CRCs in order with zlib's crc32_combine arithmetic (multiplication by
// x^(8 len) modulo the polynomial), one thread per buffer.
__device__ unsigned int gz_crc32_entry(unsigned int c) {
    for (int k = 0; k < 8; k++) c = (c & 1) ? (c >> 1) ^ 0xEDB88320u : c >> 1;
    return c;
}

__device__ unsigned int gz_multmodp(unsigned int a, unsigned int b) {
    unsigned int m = 1u << 31, p = 0;
    if (a == 0) return 0;
    for (;;) {
        if (a & m) { p ^= b; if ((a & (m - 1)) == 0) break; }
        m >>= 1;
        b = (b & 1) ? (b >> 1) ^ 0xEDB88320u : b >> 1;
    }
    return p;
}

__device__ unsigned int gz_x8nmodp(long long n) {  // x^(8 n) modulo the polynomial
    unsigned int p = 1u << 31, sq = 1u << 30;  // x^0 and x^1
    for (int k = 0; k < 3; k++) sq = gz_multmodp(sq, sq);  // x^8
    while (n) {
        if (n & 1) p = gz_multmodp(sq, p);
        n >>= 1;
        sq = gz_multmodp(sq, sq);
    }
    return p;
}

extern "C" __global__ void crc32_segments(const unsigned char* data, long long stride, long long nbytes, long long seg,
                                          long long nseg, long long total, unsigned int* out) {
    __shared__ unsigned int table[256];
    for (int k = threadIdx.x; k < 256; k += blockDim.x) table[k] = gz_crc32_entry(k);
    __syncthreads();
    long long t = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= total) return;
    long long chunk = t / nseg, s = t % nseg;
    long long start = s * seg, end = start + seg < nbytes ? start + seg : nbytes;
    const unsigned char* p = data + chunk * stride;
    unsigned int c = 0xFFFFFFFFu;
    for (long long i = start; i < end; i++) c = table[(c ^ p[i]) & 0xFF] ^ (c >> 8);
    out[t] = c ^ 0xFFFFFFFFu;
}

extern "C" __global__ void crc32_combine(const unsigned int* segs, long long nseg, long long seg, long long nbytes,
                                         int n, unsigned int* out) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    unsigned int full = gz_x8nmodp(seg);
    const unsigned int* s = segs + (long long)i * nseg;
    unsigned int c = s[0];
    for (long long k = 1; k < nseg; k++) {
        long long len = (k + 1) * seg <= nbytes ? seg : nbytes - k * seg;
        c = gz_multmodp(len == seg ? full : gz_x8nmodp(len), c) ^ s[k];
    }
    out[i] = c;
}
"""

XXH64_SRC = r"""
// The content checksum of zstd frames written with checksum=True: the low 32 bits of
// XXH64(decoded bytes, seed 0). One thread per buffer (XXH64 is sequential); buffers start
// at 8-byte aligned addresses.
#define GZ_P1 11400714785074694791ULL
#define GZ_P2 14029467366897019727ULL
#define GZ_P3 1609587929392839161ULL
#define GZ_P4 9650029242287828579ULL
#define GZ_P5 2870177450012600261ULL

__device__ unsigned long long gz_rotl64(unsigned long long x, int r) { return (x << r) | (x >> (64 - r)); }
__device__ unsigned long long gz_xxround(unsigned long long acc, unsigned long long input) {
    acc += input * GZ_P2; acc = gz_rotl64(acc, 31); return acc * GZ_P1;
}
__device__ unsigned long long gz_xxmerge(unsigned long long acc, unsigned long long val) {
    acc ^= gz_xxround(0, val); return acc * GZ_P1 + GZ_P4;
}

extern "C" __global__ void xxh64_low32(const unsigned char* data, long long stride, long long nbytes, int n,
                                       const unsigned char* wanted, unsigned int* out) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n || !wanted[i]) return;
    const unsigned char* p = data + (long long)i * stride;
    long long pos = 0;
    unsigned long long h;
    if (nbytes >= 32) {
        unsigned long long v1 = GZ_P1 + GZ_P2, v2 = GZ_P2, v3 = 0, v4 = 0 - GZ_P1;
        for (; pos + 32 <= nbytes; pos += 32) {
            const unsigned long long* q = (const unsigned long long*)(p + pos);
            v1 = gz_xxround(v1, q[0]); v2 = gz_xxround(v2, q[1]); v3 = gz_xxround(v3, q[2]); v4 = gz_xxround(v4, q[3]);
        }
        h = gz_rotl64(v1, 1) + gz_rotl64(v2, 7) + gz_rotl64(v3, 12) + gz_rotl64(v4, 18);
        h = gz_xxmerge(h, v1); h = gz_xxmerge(h, v2); h = gz_xxmerge(h, v3); h = gz_xxmerge(h, v4);
    } else {
        h = GZ_P5;
    }
    h += (unsigned long long)nbytes;
    for (; pos + 8 <= nbytes; pos += 8) {
        h ^= gz_xxround(0, *(const unsigned long long*)(p + pos));
        h = gz_rotl64(h, 27) * GZ_P1 + GZ_P4;
    }
    if (pos + 4 <= nbytes) {
        unsigned long long k = (unsigned long long)p[pos] | ((unsigned long long)p[pos + 1] << 8)
            | ((unsigned long long)p[pos + 2] << 16) | ((unsigned long long)p[pos + 3] << 24);
        h ^= k * GZ_P1;
        h = gz_rotl64(h, 23) * GZ_P2 + GZ_P3;
        pos += 4;
    }
    for (; pos < nbytes; pos++) {
        h ^= p[pos] * GZ_P5;
        h = gz_rotl64(h, 11) * GZ_P1;
    }
    h ^= h >> 33; h *= GZ_P2; h ^= h >> 29; h *= GZ_P3; h ^= h >> 32;
    out[i] = (unsigned int)(h & 0xFFFFFFFFu);
}
"""
