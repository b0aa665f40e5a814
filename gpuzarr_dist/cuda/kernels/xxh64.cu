
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
