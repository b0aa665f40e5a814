
extern "C" __global__ void lz4_block_length(const unsigned char* src, const long long* offs,
                                            const long long* sizes, long long limit, int n, long long* result) {
    // One thread walks one LZ4 block's sequences (no decoding): the decoded length it
    // describes, or a negative code where it is malformed (truncated, bad match offset,
    // longer than ``limit``).
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    const unsigned char* p = src + offs[i];
    long long len = sizes[i], ip = 0, op = 0, code = 0;
    while (code == 0) {
        if (ip >= len) { code = -1; break; }
        unsigned int token = p[ip++];
        long long lit = token >> 4;
        if (lit == 15) {
            unsigned int b;
            do { if (ip >= len) { code = -2; break; } b = p[ip++]; lit += b; } while (b == 255);
            if (code) break;
        }
        if (ip + lit > len) { code = -3; break; }
        ip += lit; op += lit;
        if (ip == len) break;
        if (ip + 2 > len) { code = -4; break; }
        long long off = p[ip] | (p[ip + 1] << 8);
        ip += 2;
        if (off == 0 || off > op) { code = -5; break; }
        long long ml = token & 15;
        if (ml == 15) {
            unsigned int b;
            do { if (ip >= len) { code = -6; break; } b = p[ip++]; ml += b; } while (b == 255);
            if (code) break;
        }
        op += ml + 4;
        if (op > limit) { code = -7; break; }
    }
    result[i] = code ? code : op;
}
