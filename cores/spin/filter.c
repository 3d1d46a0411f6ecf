/* Keeps the 16-byte records whose int32 at byte 4 is >= the threshold in
 * header word 1 (README.md). Payloads emit in parallel; the result is
 * ordered by chunk. */
#include <corefarm/spin.h>
#include <string.h>

#define HEADER 16
#define RECORD 16

int filter_head(const cf_spin_args *a, const cf_spin_ops *ops) {
    (void)ops;
    if (a->len < HEADER || a->scratch_len < 4) return 1;
    memcpy(a->scratch, a->data + 4, 4); /* the threshold, read by payloads */
    __atomic_fetch_add(&a->counters[0], 1, __ATOMIC_RELAXED);
    return 0;
}

int filter_payload(const cf_spin_args *a, const cf_spin_ops *ops) {
    int32_t threshold;
    memcpy(&threshold, a->scratch, 4);
    uint32_t i = a->offset == 0 ? HEADER : 0;
    for (; i + RECORD <= a->len; i += RECORD) {
        int32_t v;
        memcpy(&v, a->data + i + 4, 4);
        if (v >= threshold && ops->emit(ops->ctx, a->data + i, RECORD) != 0) return 3;
    }
    __atomic_fetch_add(&a->counters[1], a->len, __ATOMIC_RELAXED);
    return 0;
}
