/* Unpacks a vector datatype (README.md): header words 1-3 are count,
 * block length and stride in bytes; packed block i lands at i * stride.
 * Scratchpad: 16 bytes of parameters, then the unpacked buffer. */
#include <corefarm/spin.h>
#include <string.h>

#define HEADER 16

struct params { uint32_t count, block, stride, pad; };

int strided_head(const cf_spin_args *a, const cf_spin_ops *ops) {
    (void)ops;
    struct params p;
    if (a->len < HEADER) return 1;
    uint32_t w[4];
    memcpy(w, a->data, sizeof w);
    p.count = w[1];
    p.block = w[2];
    p.stride = w[3];
    p.pad = 0;
    if (p.block == 0 || p.stride < p.block) return 2;
    if ((uint64_t)p.count * p.stride + HEADER > a->scratch_len) return 3; /* over budget */
    memcpy(a->scratch, &p, sizeof p);
    __atomic_fetch_add(&a->counters[0], 1, __ATOMIC_RELAXED);
    return 0;
}

int strided_payload(const cf_spin_args *a, const cf_spin_ops *ops) {
    (void)ops;
    struct params p;
    memcpy(&p, a->scratch, sizeof p);
    uint32_t i = a->offset == 0 ? HEADER : 0;
    uint64_t packed = a->offset + i - HEADER; /* offset in the packed data */
    uint8_t *out = a->scratch + HEADER;
    while (i < a->len) {
        uint64_t blk = packed / p.block, in = packed % p.block;
        if (blk >= p.count) return 4; /* more data than the datatype holds */
        uint32_t n = p.block - in;
        if (n > a->len - i) n = a->len - i;
        memcpy(out + blk * p.stride + in, a->data + i, n);
        i += n;
        packed += n;
    }
    return 0;
}

int strided_tail(const cf_spin_args *a, const cf_spin_ops *ops) {
    struct params p;
    memcpy(&p, a->scratch, sizeof p);
    return ops->emit(ops->ctx, a->scratch + HEADER, p.count * p.stride);
}
