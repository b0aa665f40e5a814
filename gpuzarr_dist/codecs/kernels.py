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
}

ZSTD_FRAMES_SRC = r"""
__device__ int zstd_compressed_block(const unsigned char* q, long long bsize, long long bmax,
                                     int* lit_table, int* seq_table, long long* lo, long long* hi) {
    // RFC 8878 3.1.1.3: a compressed block's literals section header and sequences section
    // header. Returns 0 when they are consistent with the block, else a ZSTD_DEEP_REASONS code.
    if (bsize < 2) return 3;
    unsigned int b0 = q[0];
    int ltype = b0 & 3, sf = (b0 >> 2) & 3;
    long long lh, lit, lcs;
    if (ltype < 2) {  // raw or RLE literals
        if (sf == 1) { lh = 2; lit = (b0 >> 4) + ((long long)q[1] << 4); }
        else if (sf == 3) { lh = 3; if (bsize < 3) return 4; lit = (b0 >> 4) + ((long long)q[1] << 4) + ((long long)q[2] << 12); }
        else { lh = 1; lit = b0 >> 3; }
        lcs = ltype == 0 ? lit : 1;
        if (lh + lcs > bsize) return 4;
    } else {  // Huffman-coded literals (2: with a tree description, 3: treeless)
        lh = sf < 2 ? 3 : sf + 2;
        if (lh > bsize) return 4;
        unsigned long long lhc = (unsigned long long)q[0] | ((unsigned long long)q[1] << 8) | ((unsigned long long)q[2] << 16);
        if (lh > 3) lhc |= (unsigned long long)q[3] << 24;
        if (lh == 3) { lit = (lhc >> 4) & 0x3FF; lcs = (lhc >> 14) & 0x3FF; }
        else if (lh == 4) { lit = (lhc >> 4) & 0x3FFF; lcs = (long long)(lhc >> 18); }
        else { lit = (lhc >> 4) & 0x3FFFF; lcs = (long long)(lhc >> 22) + ((long long)q[4] << 10); }
        if (lh + lcs > bsize) return 4;
        int four = sf != 0;
        if (four && lit < 6) return 7;
        if (ltype == 3 && !*lit_table) return 6;
        long long tree = 0;
        if (ltype == 2) {
            if (lcs < 1) return 7;
            unsigned int hb = q[lh];
            tree = hb < 128 ? 1 + (long long)hb : 1 + ((long long)hb - 127 + 1) / 2;
            if (tree >= lcs) return 7;
            *lit_table = 1;
        }
        long long rest = lcs - tree;
        if (four) {
            if (rest < 10) return 7;
            const unsigned char* jt = q + lh + tree;
            long long s1 = jt[0] | (jt[1] << 8), s2 = jt[2] | (jt[3] << 8), s3 = jt[4] | (jt[5] << 8);
            if (s1 < 1 || s2 < 1 || s3 < 1 || s1 + s2 + s3 + 6 >= rest) return 7;
        } else if (rest < 1) return 7;
    }
    if (lit > bmax) return 5;
    long long pos = lh + lcs;
    if (pos >= bsize) return 8;
    unsigned int s0 = q[pos++];
    long long nseq = s0;
    if (s0 == 255) { if (pos + 2 > bsize) return 8; nseq = (long long)q[pos] + ((long long)q[pos + 1] << 8) + 0x7F00; pos += 2; }
    else if (s0 >= 128) { if (pos + 1 > bsize) return 8; nseq = (((long long)s0 - 128) << 8) + q[pos]; pos += 1; }
    if (nseq == 0) {
        if (pos != bsize) return 9;
        *lo += lit; *hi += lit;
        return 0;
    }
    if (pos + 1 > bsize) return 8;
    unsigned int modes = q[pos];
    if (modes & 3) return 10;
    if ((((modes >> 6) & 3) == 3 || ((modes >> 4) & 3) == 3 || ((modes >> 2) & 3) == 3) && !*seq_table) return 11;
    *seq_table = 1;
    *lo += lit; *hi += bmax;
    return 0;
}

extern "C" __global__ void zstd_frames(const unsigned char* src, const long long* offs, const long long* sizes,
                                       int n, long long* fcs_out, long long* len_out, int* deep_out) {
    // One thread reads one zstd frame's header (RFC 8878 3.1.1) and walks its block headers.
    // fcs_out: the decoded size the frame states (-1 none, -2 not zstd, -3 header cut).
    // len_out: the bytes the frame spans (-4 reserved block type).
    // deep_out: 0, or why the blocks are structurally impossible (ZSTD_DEEP_REASONS).
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    const unsigned char* p = src + offs[i];
    long long len = sizes[i];
    fcs_out[i] = -2; len_out[i] = -1; deep_out[i] = 0;
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
    if (pos + dsz + fsz > len) { fcs_out[i] = -3; return; }
    unsigned long long dict = 0;
    for (int k = 0; k < dsz; k++) dict |= ((unsigned long long)p[pos + k]) << (8 * k);
    pos += dsz;
    long long fcs = -1;
    if (fsz) {
        fcs = 0;
        for (int k = 0; k < fsz; k++) fcs |= ((long long)p[pos + k]) << (8 * k);
        if (fsz == 2) fcs += 256;
    }
    fcs_out[i] = fcs;
    pos += fsz;
    int deep = (desc & 8) ? 14 : (dict ? 1 : 0);
    long long wsize = single ? fcs : window;
    long long bmax = (wsize >= 0 && wsize < 131072) ? wsize : 131072;
    long long lo = 0, hi = 0;
    int lit_table = 0, seq_table = 0;
    while (1) {
        if (pos + 3 > len) { len_out[i] = pos + 3; break; }
        unsigned int h = p[pos] | (p[pos + 1] << 8) | (p[pos + 2] << 16);
        pos += 3;
        unsigned int kind = (h >> 1) & 3;
        long long bsize = h >> 3;
        if (kind == 3) { len_out[i] = -4; return; }
        long long end = pos + (kind == 1 ? 1 : bsize);
        if (!deep) {
            if (bsize > bmax) deep = 2;
            else if (kind < 2) { lo += bsize; hi += bsize; }
            else if (end <= len) deep = zstd_compressed_block(p + pos, bsize, bmax, &lit_table, &seq_table, &lo, &hi);
        }
        pos = end;
        if (h & 1) { len_out[i] = pos + 4 * cks; break; }
    }
    if (!deep && fcs >= 0 && len_out[i] <= len && (lo > fcs || hi < fcs)) deep = 12;
    deep_out[i] = deep;
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
