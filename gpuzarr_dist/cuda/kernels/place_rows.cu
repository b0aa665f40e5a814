
extern "C" __global__ void place_rows(const T* chunks, T* out, long long rows, int nd, const long long* dims,
                                      long long tile_stride) {
    // dims: the block's shape, the chunk shape, the grid (chunks per axis), the block's start in its first chunk
    const long long *shape = dims, *chunk = dims + nd, *grid = dims + 2 * nd, *start = dims + 3 * nd;
    const U X = (U)shape[nd - 1], cx = (U)chunk[nd - 1], sx = (U)start[nd - 1];
    for (long long r = blockIdx.x; r < rows; r += gridDim.x) {
        long long rem = r, tile = 0, within = 0, tmul = grid[nd - 1], wmul = chunk[nd - 1];
        for (int d = nd - 2; d >= 0; d--) {
            long long o = rem % shape[d], g, q;
            rem /= shape[d];
            g = o + start[d];
            q = g / chunk[d];
            tile += q * tmul; tmul *= grid[d];
            within += (g - q * chunk[d]) * wmul; wmul *= chunk[d];
        }
        const T* src = chunks + tile * tile_stride + within;  // the row's first chunk along the last axis
        T* dst = out + r * (long long)X;
        for (U x = threadIdx.x; x < X; x += blockDim.x) {
            U g = x + sx, q = g / cx;
            dst[x] = src[(long long)q * tile_stride + (g - q * cx)];
        }
    }
}
