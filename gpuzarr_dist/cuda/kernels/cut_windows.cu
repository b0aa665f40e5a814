
long long w = i / wsize, rem = i % wsize;
long long g = 0, c = 0, gmul = 1, cmul = 1;
for (int a = nd - 1; a >= 0; --a) {
    const long long wa = dims[a], ca = dims[nd + a], ga = dims[2 * nd + a];
    const long long o = offsets[w * nd + a] + rem % wa;
    rem /= wa;
    g += (o / ca) * gmul;
    gmul *= ga;
    c += (o % ca) * cmul;
    cmul *= ca;
}
const long long k = idx[w * gsize + g];
out = k < m ? chunks[k * csize + c] : fill;
