
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
