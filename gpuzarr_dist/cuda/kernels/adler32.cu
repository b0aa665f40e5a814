
// adler32 (RFC 1950) of many buffers of any lengths: adler32_segments gives each thread one segment of
// up to ``seg`` bytes of one buffer (A = sum d, B = sum (L - i) d, mod 65521); adler32_combine joins a
// buffer's segments in order (zlib's adler32_combine arithmetic), one thread per buffer.
#define GZD_MOD 65521u

extern "C" __global__ void adler32_segments(const unsigned char* data, const long long* offs, const long long* lens,
                                            const long long* seg0, int n, long long seg, long long total,
                                            unsigned int* out) {
    long long t = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= total) return;
    int lo = 0, hi = n - 1;  // the buffer whose segments [seg0[j], seg0[j + 1]) hold t
    while (lo < hi) {
        int mid = (lo + hi + 1) / 2;
        if (seg0[mid] <= t) lo = mid; else hi = mid - 1;
    }
    long long k = t - seg0[lo], start = k * seg, rest = lens[lo] - start;
    long long L = rest < seg ? rest : seg;
    const unsigned char* p = data + offs[lo] + start;
    unsigned long long a = 0, b = 0;
    for (long long i = 0; i < L; i++) {
        a += p[i];
        b += (unsigned long long)(L - i) * p[i];
    }
    out[2 * t] = (unsigned int)(a % GZD_MOD);
    out[2 * t + 1] = (unsigned int)(b % GZD_MOD);
}

extern "C" __global__ void adler32_combine(const unsigned int* segs, const long long* lens, const long long* seg0,
                                           int n, long long seg, unsigned int* out) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    unsigned long long a = 1, b = 0;
    for (long long t = seg0[i]; t < seg0[i + 1]; t++) {
        long long k = t - seg0[i], rest = lens[i] - k * seg;
        unsigned long long L = (unsigned long long)(rest < seg ? rest : seg) % GZD_MOD;
        b = (b + L * a + segs[2 * t + 1]) % GZD_MOD;
        a = (a + segs[2 * t]) % GZD_MOD;
    }
    out[i] = (unsigned int)((b << 16) | a);
}
