
// RFC 1951 inflate without output: returns the decoded length, or a negative code (DEFLATE_WALK_REASONS).
// Canonical Huffman codes are decoded with a table of the codes up to GZD_FAST bits (indexed by the
// next bits of the stream, least significant first) and, for longer codes, code by code from the
// counts per length (as Mark Adler's puff.c decodes them).
#define GZD_FAST 10

struct gzd_bits {
    const unsigned char* p;
    long long len, ip;        // input bytes, and bytes loaded into the bit buffer (past len: zeros)
    unsigned long long bb;    // bit buffer, next bit in bit 0
    int bc;                   // bits in bb
};

struct gzd_huff {
    short count[16];               // codes of each length
    short symbol[288];             // symbols in canonical order
    unsigned short fast[1 << GZD_FAST];  // (symbol << 4) | length for codes up to fastbits long; 0: none
};

__device__ const short gzd_lbase[29] = {3, 4, 5, 6, 7, 8, 9, 10, 11, 13, 15, 17, 19, 23, 27, 31, 35, 43, 51, 59,
                                        67, 83, 99, 115, 131, 163, 195, 227, 258};
__device__ const unsigned char gzd_lext[29] = {0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3,
                                               4, 4, 4, 4, 5, 5, 5, 5, 0};
__device__ const int gzd_dbase[30] = {1, 2, 3, 4, 5, 7, 9, 13, 17, 25, 33, 49, 65, 97, 129, 193, 257, 385, 513, 769,
                                      1025, 1537, 2049, 3073, 4097, 6145, 8193, 12289, 16385, 24577};
__device__ const unsigned char gzd_dext[30] = {0, 0, 0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7, 8, 8,
                                               9, 9, 10, 10, 11, 11, 12, 12, 13, 13};
__device__ const unsigned char gzd_clorder[19] = {16, 17, 18, 0, 8, 7, 9, 6, 10, 5, 11, 4, 12, 3, 13, 2, 14, 1, 15};

__device__ void gzd_refill(gzd_bits* s) {
    while (s->bc <= 56) {
        unsigned long long b = s->ip < s->len ? s->p[s->ip] : 0;
        s->bb |= b << s->bc;
        s->ip++;
        s->bc += 8;
    }
}

__device__ unsigned int gzd_take(gzd_bits* s, int n) {  // n <= 16 bits
    if (s->bc < n) gzd_refill(s);
    unsigned int v = (unsigned int)(s->bb & ((1ULL << n) - 1));
    s->bb >>= n;
    s->bc -= n;
    return v;
}

__device__ int gzd_past_end(const gzd_bits* s) {  // more bits consumed than the input holds
    return s->ip * 8 - s->bc > s->len * 8;
}

__device__ int gzd_build(gzd_huff* h, const unsigned char* lengths, int n, int fastbits, int* maxlen) {
    // Counts, canonical symbol order and the fast table of a code. Returns the codes left unused
    // (0: complete, > 0: incomplete) or a negative number (oversubscribed).
    short offs[16];
    for (int l = 0; l < 16; l++) h->count[l] = 0;
    for (int s = 0; s < n; s++) h->count[lengths[s]]++;
    int max = 15;
    while (max > 0 && h->count[max] == 0) max--;
    *maxlen = max;
    int left = 1;
    for (int l = 1; l < 16; l++) {
        left <<= 1;
        left -= h->count[l];
        if (left < 0) return left;
    }
    offs[1] = 0;
    for (int l = 1; l < 15; l++) offs[l + 1] = offs[l] + h->count[l];
    for (int s = 0; s < n; s++)
        if (lengths[s]) h->symbol[offs[lengths[s]]++] = (short)s;
    int size = 1 << fastbits;
    for (int k = 0; k < size; k++) h->fast[k] = 0;
    unsigned int code = 0;
    int idx = 0;
    for (int l = 1; l <= fastbits; l++) {
        for (int c = 0; c < h->count[l]; c++, idx++) {
            unsigned int v = code + c, rev = 0;
            for (int b = 0; b < l; b++) { rev = (rev << 1) | (v & 1); v >>= 1; }
            unsigned short e = (unsigned short)((h->symbol[idx] << 4) | l);
            for (unsigned int k = rev; k < (unsigned int)size; k += 1u << l) h->fast[k] = e;
        }
        code = (code + h->count[l]) << 1;
    }
    return left;
}

__device__ int gzd_decode(gzd_bits* s, const gzd_huff* h, int fastbits) {
    // The next symbol of code h, or -1 where the bits are no code of it.
    if (s->bc < 15) gzd_refill(s);
    unsigned short e = h->fast[s->bb & ((1u << fastbits) - 1)];
    if (e) {
        int l = e & 15;
        s->bb >>= l;
        s->bc -= l;
        return e >> 4;
    }
    int code = 0, first = 0, index = 0;
    unsigned long long bb = s->bb;
    for (int l = 1; l <= 15; l++) {
        code |= (int)(bb & 1);
        bb >>= 1;
        int count = h->count[l];
        if (code - count < first) {
            s->bb >>= l;
            s->bc -= l;
            return h->symbol[index + (code - first)];
        }
        index += count;
        first += count;
        first <<= 1;
        code <<= 1;
    }
    return -1;
}

__device__ long long gzd_codes(gzd_bits* s, const gzd_huff* lit, const gzd_huff* dist, long long out, long long limit) {
    // The symbols of one Huffman block: the output length after it, or a negative code.
    for (;;) {
        if (s->ip > s->len + 8) return -21;  // at least one bit past the input consumed
        int sym = gzd_decode(s, lit, GZD_FAST);
        if (sym < 0) return -17;
        if (sym < 256) {
            if (++out > limit) return -20;
        } else if (sym == 256) {
            return out;
        } else {
            sym -= 257;
            if (sym >= 29) return -17;
            long long n = gzd_lbase[sym] + gzd_take(s, gzd_lext[sym]);
            int ds = gzd_decode(s, dist, GZD_FAST);
            if (ds < 0 || ds >= 30) return -18;
            long long d = gzd_dbase[ds] + gzd_take(s, gzd_dext[ds]);
            if (d > out) return -19;
            out += n;
            if (out > limit) return -20;
        }
    }
}

__device__ long long gzd_inflate(const unsigned char* p, long long len, long long limit, long long* end) {
    // Walk the deflate data p[0:len]; *end: the byte after its last bit (when it ends).
    gzd_bits s;
    s.p = p; s.len = len; s.ip = 0; s.bb = 0; s.bc = 0;
    gzd_huff lit, dist;
    unsigned char lengths[320];
    long long out = 0;
    int last;
    do {
        if (gzd_past_end(&s)) return -21;
        last = gzd_take(&s, 1);
        int type = gzd_take(&s, 2);
        int maxl;
        if (type == 0) {
            int drop = s.bc & 7;  // to the next byte boundary
            s.bb >>= drop;
            s.bc -= drop;
            unsigned int n = gzd_take(&s, 16), nn = gzd_take(&s, 16);
            if (gzd_past_end(&s)) return -21;
            if (n != (~nn & 0xFFFFu)) return -7;
            long long pos = (s.ip * 8 - s.bc) / 8;
            if (pos + n > len) return -8;
            out += n;
            if (out > limit) return -20;
            s.ip = pos + n; s.bb = 0; s.bc = 0;
        } else if (type == 1) {
            for (int k = 0; k < 288; k++) lengths[k] = k < 144 ? 8 : (k < 256 ? 9 : (k < 280 ? 7 : 8));
            for (int k = 0; k < 32; k++) lengths[288 + k] = 5;
            gzd_build(&lit, lengths, 288, GZD_FAST, &maxl);
            gzd_build(&dist, lengths + 288, 32, GZD_FAST, &maxl);  // 30, 31: rejected when used
            out = gzd_codes(&s, &lit, &dist, out, limit);
            if (out < 0) return out;
        } else if (type == 2) {
            int nlen = gzd_take(&s, 5) + 257, ndist = gzd_take(&s, 5) + 1, ncode = gzd_take(&s, 4) + 4;
            if (nlen > 286 || ndist > 30) return -9;
            unsigned char cl[19];
            for (int k = 0; k < 19; k++) cl[k] = 0;
            for (int k = 0; k < ncode; k++) cl[gzd_clorder[k]] = (unsigned char)gzd_take(&s, 3);
            if (gzd_build(&dist, cl, 19, 7, &maxl) != 0) return -10;  // must be complete (as zlib)
            int idx = 0;
            while (idx < nlen + ndist) {
                if (gzd_past_end(&s)) return -21;
                int sym = gzd_decode(&s, &dist, 7);
                if (sym < 0) return -13;
                if (sym < 16) { lengths[idx++] = (unsigned char)sym; continue; }
                int rep, val = 0;
                if (sym == 16) {
                    if (idx == 0) return -11;
                    val = lengths[idx - 1];
                    rep = 3 + gzd_take(&s, 2);
                } else if (sym == 17) {
                    rep = 3 + gzd_take(&s, 3);
                } else {
                    rep = 11 + gzd_take(&s, 7);
                }
                if (idx + rep > nlen + ndist) return -12;
                while (rep--) lengths[idx++] = (unsigned char)val;
            }
            if (lengths[256] == 0) return -14;
            // zlib's rule: a code may be incomplete only where all its codes are one bit long
            // (a single code); distances may also have no code at all (a block without matches)
            int left = gzd_build(&lit, lengths, nlen, GZD_FAST, &maxl);
            if (left < 0 || (left > 0 && maxl != 1)) return -15;
            left = gzd_build(&dist, lengths + nlen, ndist, GZD_FAST, &maxl);
            if (left < 0 || (left > 0 && maxl > 1)) return -16;
            out = gzd_codes(&s, &lit, &dist, out, limit);
            if (out < 0) return out;
        } else {
            return -6;
        }
    } while (!last);
    long long used = s.ip * 8 - s.bc;
    if (used > len * 8) return -21;
    *end = (used + 7) / 8;
    return out;
}

__device__ int gzd_wrapper(const unsigned char* p, long long len, int wrap, long long* start, long long* stop) {
    // Where the deflate data of a raw (0), zlib (1) or gzip (2) stream starts and where its trailer starts.
    *start = 0;
    *stop = len;
    if (wrap == 1) {
        if (len < 6) return -1;
        unsigned int cmf = p[0], flg = p[1];
        if ((cmf & 15) != 8 || (cmf >> 4) > 7 || (cmf * 256 + flg) % 31 || (flg & 0x20)) return -2;
        *start = 2;
        *stop = len - 4;
    } else if (wrap == 2) {
        if (len < 18) return -1;
        if (p[0] != 0x1F || p[1] != 0x8B || p[2] != 8) return -3;
        unsigned int flg = p[3];
        if (flg & 0xE0) return -4;
        long long pos = 10, lim = len - 8;
        if (flg & 4) {
            if (pos + 2 > lim) return -5;
            pos += 2 + (p[pos] | (p[pos + 1] << 8));
            if (pos > lim) return -5;
        }
        for (int field = 8; field <= 16; field <<= 1) {  // FNAME, FCOMMENT: zero-terminated
            if (!(flg & field)) continue;
            while (pos < lim && p[pos]) pos++;
            if (pos >= lim) return -5;
            pos++;
        }
        if (flg & 2) {
            pos += 2;
            if (pos > lim) return -5;
        }
        *start = pos;
        *stop = lim;
    }
    return 0;
}

extern "C" __global__ void deflate_walk(const unsigned char* src, const long long* offs, const long long* sizes,
                                        const long long* limits, int n, int wrap, long long* out_len,
                                        long long* out_end) {
    // One thread per stream src[offs[i] : offs[i] + sizes[i]]: out_len[i] is its decoded length (at most
    // limits[i]) or a negative code; out_end[i] where its deflate data ended (-1: it did not).
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    const unsigned char* p = src + offs[i];
    long long len = sizes[i], start, stop, end = -1;
    long long r = gzd_wrapper(p, len, wrap, &start, &stop);
    if (r == 0) {
        r = gzd_inflate(p + start, stop - start, limits[i], &end);
        if (r >= 0 && end != stop - start) r = -22;
    }
    out_len[i] = r;
    out_end[i] = end >= 0 ? start + end : -1;
}
