"""A small RFC 8878 zstd decoder in pure Python that notes what is unusual in a frame (not for speed).

Used by ``dev/replay_zstd.py`` to characterise damaged frames: it reads bits below the start of a
backward bit stream as zeros (as the RFC describes the stream) and notes every Huffman literal stream and
sequences bit stream that is not used up exactly, block sizes above the maximum, offsets beyond the window.
Raises :class:`Corrupt` where a frame cannot be decoded at all. ``tests/test_zstd_rfc_decode.py`` checks it
against libzstd on valid frames.
"""

LL_BASE = [0,1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,18,20,22,24,28,32,40,48,64,128,256,512,1024,2048,4096,8192,16384,32768,65536]
LL_BITS = [0]*16 + [1,1,1,1,2,2,3,3,4,6,7,8,9,10,11,12,13,14,15,16]
ML_BASE = [3,4,5,6,7,8,9,10,11,12,13,14,15,16,17,18,19,20,21,22,23,24,25,26,27,28,29,30,31,32,33,34,35,37,39,41,43,47,51,59,67,83,99,131,259,515,1027,2051,4099,8195,16387,32771,65539]
ML_BITS = [0]*32 + [1,1,1,1,2,2,3,3,4,4,5,7,8,9,10,11,12,13,14,15,16]
LL_DEF = [4,3,2,2,2,2,2,2,2,2,2,2,2,1,1,1,2,2,2,2,2,2,2,2,2,3,2,1,1,1,1,1,-1,-1,-1,-1]
ML_DEF = [1,4,3,2,2,2,2,2,2,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,-1,-1,-1,-1,-1,-1,-1]
OF_DEF = [1,1,1,1,1,1,2,2,2,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,-1,-1,-1,-1,-1]


class Corrupt(Exception):
    pass


class Back:
    """Backward bit stream (4.1): bits read from the highest position down; below 0 reads zeros."""
    def __init__(self, b):
        if not b or b[-1] == 0:
            raise Corrupt("bit stream empty or last byte zero")
        self.v = int.from_bytes(b, "little")
        self.pos = 8 * (len(b) - 1) + b[-1].bit_length() - 1
    def read(self, n):
        if n == 0:
            return 0
        start = self.pos - n
        if start >= 0:
            r = (self.v >> start) & ((1 << n) - 1)
        else:
            r = (self.v & ((1 << self.pos) - 1)) << (-start) if self.pos > 0 else 0
        self.pos = start
        return r
    def peek(self, n):
        p = self.pos
        r = self.read(n)
        self.pos = p
        return r


def fwd_bits(q, bp, n):
    v = int.from_bytes(bytes(q[bp >> 3 : (bp >> 3) + 4]).ljust(4, b"\0"), "little")
    return (v >> (bp & 7)) & ((1 << n) - 1)


def ncount(q, maxs, maxal):
    if len(q) < 1:
        raise Corrupt("fse: empty")
    al = (q[0] & 15) + 5
    if al > maxal:
        raise Corrupt("fse: accuracy log")
    bp = 4
    remaining, threshold, nb, norm, prev0 = (1 << al) + 1, 1 << al, al + 1, [], False
    while remaining > 1:
        if prev0:
            while True:
                rep = fwd_bits(q, bp, 2)
                bp += 2
                norm += [0] * rep
                if rep != 3:
                    break
        if len(norm) > maxs or bp > 8 * len(q):
            raise Corrupt("fse: symbols")
        mx = (2 * threshold - 1) - remaining
        v = fwd_bits(q, bp, nb)
        if (v & (threshold - 1)) < mx:
            count = v & (threshold - 1)
            bp += nb - 1
        else:
            count = v & (2 * threshold - 1)
            if count >= threshold:
                count -= mx
            bp += nb
        count -= 1
        remaining -= abs(count)
        if remaining < 1:
            raise Corrupt("fse: counts")
        norm.append(count)
        prev0 = count == 0
        while remaining < threshold:
            nb -= 1
            threshold >>= 1
    if bp > 8 * len(q):
        raise Corrupt("fse: past end")
    return norm, al, (bp + 7) >> 3


def fse_build(norm, al):
    size = 1 << al
    high = size - 1
    sym = [0] * size
    nxt = [0] * len(norm)
    for s, c in enumerate(norm):
        if c == -1:
            sym[high] = s
            high -= 1
            nxt[s] = 1
        else:
            nxt[s] = max(c, 0)
    step, pos = (size >> 1) + (size >> 3) + 3, 0
    for s, c in enumerate(norm):
        for _ in range(max(c, 0)):
            sym[pos] = s
            pos = (pos + step) & (size - 1)
            while pos > high:
                pos = (pos + step) & (size - 1)
    table = []
    for u in range(size):
        s = sym[u]
        ns = nxt[s]
        nxt[s] += 1
        nb = al - (ns.bit_length() - 1)
        table.append((s, nb, (ns << nb) - size))
    return table, al


def huf_weights(q):
    hb = q[0]
    if hb >= 128:
        n = hb - 127
        nbytes = (n + 1) // 2
        w = [(q[1 + k // 2] >> 4) if k % 2 == 0 else (q[1 + k // 2] & 15) for k in range(n)]
        used = 1 + nbytes
    else:
        cs = hb
        data = q[1 : 1 + cs]
        if len(data) < cs:
            raise Corrupt("huf: tree past block")
        norm, al, nc = ncount(data, 255, 6)
        t, _ = fse_build(norm, al)
        bs = Back(data[nc:])
        s1, s2 = bs.read(al), bs.read(al)
        w = []
        while True:
            w.append(t[s1][0])
            s1 = t[s1][2] + bs.read(t[s1][1])
            if bs.pos < 0:
                w.append(t[s2][0])
                break
            w.append(t[s2][0])
            s2 = t[s2][2] + bs.read(t[s2][1])
            if bs.pos < 0:
                w.append(t[s1][0])
                break
            if len(w) > 255:
                raise Corrupt("huf: too many weights")
        used = 1 + cs
    total = sum(1 << (x - 1) for x in w if x)
    maxbits = total.bit_length()
    rest = (1 << maxbits) - total
    if rest & (rest - 1) or rest == 0:
        raise Corrupt("huf: weights not completable")
    w.append(rest.bit_length())
    if maxbits > 11:
        raise Corrupt("huf: max bits > 11")
    return w, maxbits, used


def huf_table(w, maxbits):
    # lengths nb = maxbits + 1 - w; canonical: by increasing weight, then symbol, codes counting up
    table = [None] * (1 << maxbits)
    code = 0
    syms = sorted([(x, s) for s, x in enumerate(w) if x], key=lambda t: (t[0], t[1]))
    prev_len = None
    for x, s in syms:
        L = maxbits + 1 - x
        if prev_len is not None and L < prev_len:
            code >>= (prev_len - L)
        prev_len = L
        span = 1 << (maxbits - L)
        for k in range(code * span, (code + 1) * span):
            table[k] = (s, L)
        code += 1
    return table, maxbits


def huf_stream(b, n, tab, notes, tag):
    table, mb = tab
    bs = Back(b)
    out = bytearray()
    for _ in range(n):
        s, L = table[bs.peek(mb)]
        bs.read(L)
        out.append(s)
    if bs.pos != 0:
        notes.append(f"{tag}: Huffman stream not consumed exactly (bit position {bs.pos} after {n} symbols)")
    return bytes(out)


class State:
    def __init__(self):
        self.huf = None
        self.tables = [None, None, None]
        self.rep = [1, 4, 8]


def seq_table(q, mode, kind, st):
    maxs, maxal = (35, 9) if kind == 0 else (31, 8) if kind == 1 else (52, 9)
    if mode == 0:
        d = (LL_DEF, OF_DEF, ML_DEF)[kind]
        st.tables[kind] = fse_build(d, 5 if kind == 1 else 6)
        return 0
    if mode == 1:
        if q[0] > maxs:
            raise Corrupt("rle symbol out of range")
        st.tables[kind] = ([(q[0], 0, 0)], 0)
        return 1
    if mode == 2:
        norm, al, nc = ncount(q, maxs, maxal)
        if len(norm) > maxs + 1:
            raise Corrupt("fse: symbol out of range")
        st.tables[kind] = fse_build(norm, al)
        return nc
    if st.tables[kind] is None:
        raise Corrupt("repeat of an undefined table")
    return 0


def block(q, out, st, bmax, window, notes, bi, frame_start):
    b0 = q[0]
    ltype, sf = b0 & 3, (b0 >> 2) & 3
    if ltype < 2:
        if sf == 1:
            lh, lit = 2, (b0 >> 4) + (q[1] << 4)
        elif sf == 3:
            lh, lit = 3, (b0 >> 4) + (q[1] << 4) + (q[2] << 12)
        else:
            lh, lit = 1, b0 >> 3
        literals = bytes(q[lh : lh + lit]) if ltype == 0 else bytes([q[lh]]) * lit
        pos = lh + (lit if ltype == 0 else 1)
        lkind = "raw" if ltype == 0 else "rle"
    else:
        lh = 3 if sf < 2 else sf + 2
        v = int.from_bytes(q[:lh], "little")
        if lh == 3:
            lit, lcs = (v >> 4) & 0x3FF, (v >> 14) & 0x3FF
        elif lh == 4:
            lit, lcs = (v >> 4) & 0x3FFF, v >> 18
        else:
            lit, lcs = (v >> 4) & 0x3FFFF, v >> 22
        four = sf != 0
        p = lh
        if ltype == 2:
            w, mb, used = huf_weights(q[p:])
            st.huf = huf_table(w, mb)
            p += used
        elif st.huf is None:
            raise Corrupt("treeless without a table")
        end = lh + lcs
        if four:
            s1, s2, s3 = (int.from_bytes(q[p + 2 * k : p + 2 * k + 2], "little") for k in range(3))
            p += 6
            s4 = end - p - s1 - s2 - s3
            per = (lit + 3) // 4
            parts = []
            for k, (sz, n) in enumerate(zip((s1, s2, s3, s4), (per, per, per, lit - 3 * per))):
                parts.append(huf_stream(bytes(q[p : p + sz]), n, st.huf, notes, f"block {bi} literal stream {k}"))
                p += sz
            literals = b"".join(parts)
        else:
            literals = huf_stream(bytes(q[p:end]), lit, st.huf, notes, f"block {bi} literal stream")
        pos = end
        lkind = ("huffman" if ltype == 2 else "treeless") + ("x4" if four else "x1")
    if lit > bmax:
        notes.append(f"block {bi}: literals {lit} > block max {bmax}")
    s0 = q[pos]
    pos += 1
    if s0 == 255:
        nseq = q[pos] + (q[pos + 1] << 8) + 0x7F00
        pos += 2
    elif s0 >= 128:
        nseq = ((s0 - 128) << 8) + q[pos]
        pos += 1
    else:
        nseq = s0
    info = {"block": bi, "literals": lkind, "nlit": lit, "nseq": nseq}
    start_out = len(out)
    if nseq == 0:
        out += literals
        return info
    modes = q[pos]
    pos += 1
    if modes & 3:
        notes.append(f"block {bi}: reserved bits in the sequences modes byte")
    for kind in range(3):
        pos += seq_table(q[pos:], (modes >> (6 - 2 * kind)) & 3, kind, st)
    bs = Back(bytes(q[pos:]))
    (llt, lla), (oft, ofa), (mlt, mla) = st.tables
    sll, sof, sml = bs.read(lla), bs.read(ofa), bs.read(mla)
    lp = 0
    for k in range(nseq):
        ofc, llc, mlc = oft[sof][0], llt[sll][0], mlt[sml][0]
        ofv = (1 << ofc) + bs.read(ofc)
        mlv = ML_BASE[mlc] + bs.read(ML_BITS[mlc])
        llv = LL_BASE[llc] + bs.read(LL_BITS[llc])
        if ofv > 3:
            off = ofv - 3
            st.rep = [off, st.rep[0], st.rep[1]]
        else:
            idx = ofv - 1 + (llv == 0)
            if idx == 0:
                off = st.rep[0]
            else:
                off = st.rep[0] - 1 if idx == 3 else st.rep[idx]
                if idx != 1:
                    st.rep[2] = st.rep[1]
                st.rep[1] = st.rep[0]
                st.rep[0] = off
            if off <= 0:
                raise Corrupt(f"block {bi} seq {k}: repeat offset {off}")
        if lp + llv > len(literals):
            raise Corrupt(f"block {bi} seq {k}: literal length past the literals")
        out += literals[lp : lp + llv]
        lp += llv
        have = len(out) - frame_start
        if off > have:
            raise Corrupt(f"block {bi} seq {k}: offset {off} before the frame start ({have} bytes decoded)")
        if window is not None and off > window:
            notes.append(f"block {bi} seq {k}: offset {off} beyond the window {window} (at output {have})")
        for _ in range(mlv):
            out.append(out[-off])
        if k + 1 < nseq:
            sll = llt[sll][2] + bs.read(llt[sll][1])
            sml = mlt[sml][2] + bs.read(mlt[sml][1])
            sof = oft[sof][2] + bs.read(oft[sof][1])
    if bs.pos != 0:
        notes.append(f"block {bi}: sequence bit stream not consumed exactly (bit position {bs.pos})")
    out += literals[lp:]
    if len(out) - start_out > bmax:
        notes.append(f"block {bi}: regenerates {len(out) - start_out} > block max {bmax}")
    return info


def decode(frame: bytes, strict=False):
    """(output, notes, blocks): a frame decoded the way RFC 8878 describes; ``Corrupt`` where it is undecodable."""
    q = bytes(frame)
    if int.from_bytes(q[:4], "little") != 0xFD2FB528:
        raise Corrupt("magic")
    desc = q[4]
    single, dflag, fflag, cks = (desc >> 5) & 1, desc & 3, desc >> 6, (desc >> 2) & 1
    notes = []
    if desc & 8:
        notes.append("frame header reserved bit")
    pos = 5
    window = None
    if not single:
        wd = q[5]
        base = 1 << (10 + (wd >> 3))
        window = base + (base // 8) * (wd & 7)
        pos = 6
    pos += [0, 1, 2, 4][dflag]
    fsz = [single, 2, 4, 8][fflag]
    fcs = None
    if fsz:
        fcs = int.from_bytes(q[pos : pos + fsz], "little") + (256 if fsz == 2 else 0)
    pos += fsz
    bmax = min(window if window is not None else fcs, 131072)
    out = bytearray()
    st = State()
    blocks = []
    bi = 0
    while True:
        h = int.from_bytes(q[pos : pos + 3], "little")
        pos += 3
        kind, bsize, last = (h >> 1) & 3, h >> 3, h & 1
        if bsize > bmax and kind != 1:
            notes.append(f"block {bi}: size {bsize} > block max {bmax}")
        if kind == 0:
            out += q[pos : pos + bsize]
            pos += bsize
            blocks.append({"block": bi, "type": "raw", "size": bsize})
        elif kind == 1:
            out += bytes([q[pos]]) * bsize
            pos += 1
            blocks.append({"block": bi, "type": "rle", "size": bsize})
        elif kind == 2:
            start = len(out)
            info = block(q[pos : pos + bsize], out, st, bmax, window, notes, bi, 0)
            info.update(type="compressed", size=bsize, out_start=start, out_end=len(out))
            blocks.append(info)
            pos += bsize
        else:
            raise Corrupt("reserved block type")
        bi += 1
        if last:
            break
    if fcs is not None and len(out) != fcs:
        notes.append(f"decoded {len(out)} bytes, the header states {fcs}")
    if pos + 4 * cks != len(frame):
        notes.append(f"frame spans {pos + 4 * cks} bytes of {len(frame)}")
    return bytes(out), notes, blocks
