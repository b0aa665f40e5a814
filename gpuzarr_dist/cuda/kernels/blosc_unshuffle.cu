
extern "C" __global__ void blosc_unshuffle(
        const unsigned char* buf, unsigned char* out, const long long* piece_at,
        const long long* dst, const long long* size, const long long* piece0, const long long* neblock,
        const long long* typesize, const long long* mode, const long long* seg_block,
        const long long* seg_start, long long nseg, long long seg_len) {
    // One CUDA block writes ``seg_len`` bytes of one Blosc block; see blosc_frames.py for the
    // arithmetic (mode 0 copy, 1 byte unshuffle, 2 bit unshuffle).
    for (long long g = blockIdx.x; g < nseg; g += gridDim.x) {
        long long b = seg_block[g];
        unsigned int sz = (unsigned int)size[b], nb = (unsigned int)neblock[b], ts = (unsigned int)typesize[b];
        const long long* pa = piece_at + piece0[b];
        unsigned char* o = out + dst[b];
        int m = (int)mode[b];
        unsigned int n = sz / ts;
        if (m == 2 && (n % 8) != 0) m = 0;  // c-blosc bit-shuffles whole groups of 8 elements only
        unsigned int lo = (unsigned int)seg_start[g];
        unsigned int hi = lo + (unsigned int)seg_len < sz ? lo + (unsigned int)seg_len : sz;
        for (unsigned int d = lo + threadIdx.x; d < hi; d += blockDim.x) {
            unsigned int e = d / ts, k = d - e * ts;
            unsigned char v;
            if (m == 1 && e < n) {
                unsigned int p = k * n + e, s = p / nb;
                v = buf[pa[s] + (p - s * nb)];
            } else if (m == 2 && e < n) {
                unsigned int row = n / 8, sh = e % 8;
                v = 0;
                for (unsigned int q = 0; q < 8; q++) {
                    unsigned int p = (8 * k + q) * row + e / 8, s = p / nb;
                    v |= (unsigned char)(((buf[pa[s] + (p - s * nb)] >> sh) & 1) << q);
                }
            } else {
                unsigned int s = d / nb;
                v = buf[pa[s] + (d - s * nb)];
            }
            o[d] = v;
        }
    }
}
