
extern "C" __global__ void gather_chunks(const unsigned long long* src, const long long* dst_off,
                                         const long long* sizes, unsigned char* dst) {
    // chunk blockIdx.x, copied by gridDim.y blocks of threads; 16-byte words where both ends allow it
    const int i = blockIdx.x;
    const unsigned char* s = (const unsigned char*)src[i];
    unsigned char* d = dst + dst_off[i];
    const long long n = sizes[i];
    const long long first = (long long)blockIdx.y * blockDim.x + threadIdx.x;
    const long long step = (long long)gridDim.y * blockDim.x;
    long long done = 0;
    if ((((unsigned long long)s) & 15) == 0 && (((unsigned long long)d) & 15) == 0) {
        const long long n16 = n >> 4;
        const uint4* s4 = (const uint4*)s;
        uint4* d4 = (uint4*)d;
        for (long long k = first; k < n16; k += step) d4[k] = s4[k];
        done = n16 << 4;
    }
    for (long long k = done + first; k < n; k += step) d[k] = s[k];
}
