/* Sums the int32 values of a message into an int64 (README.md). */
#include <corefarm/spin.h>
#include <string.h>

#define HEADER 16

int sum_head(const cf_spin_args *a, const cf_spin_ops *ops) {
    (void)ops;
    if (a->scratch_len < 8) return 1;
    __atomic_fetch_add(&a->counters[0], 1, __ATOMIC_RELAXED);
    return 0;
}

int sum_payload(const cf_spin_args *a, const cf_spin_ops *ops) {
    (void)ops;
    uint32_t skip = a->offset == 0 ? HEADER : 0;
    if (a->len < skip) return 2;
    int64_t s = 0;
    for (uint32_t i = skip; i + 4 <= a->len; i += 4) {
        int32_t v;
        memcpy(&v, a->data + i, 4);
        s += v;
    }
    __atomic_fetch_add((int64_t *)a->scratch, s, __ATOMIC_RELAXED);
    __atomic_fetch_add(&a->counters[1], a->len, __ATOMIC_RELAXED);
    return 0;
}

int sum_tail(const cf_spin_args *a, const cf_spin_ops *ops) {
    int64_t s = __atomic_load_n((int64_t *)a->scratch, __ATOMIC_ACQUIRE);
    return ops->emit(ops->ctx, (const uint8_t *)&s, sizeof s);
}
