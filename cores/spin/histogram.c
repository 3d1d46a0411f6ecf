/* 256-bin histogram of the data bytes (README.md). */
#include <corefarm/spin.h>

#define HEADER 16

int histogram_head(const cf_spin_args *a, const cf_spin_ops *ops) {
    (void)ops;
    if (a->scratch_len < 256 * 8) return 1;
    __atomic_fetch_add(&a->counters[0], 1, __ATOMIC_RELAXED);
    return 0;
}

int histogram_payload(const cf_spin_args *a, const cf_spin_ops *ops) {
    (void)ops;
    uint64_t local[256] = {0};
    for (uint32_t i = a->offset == 0 ? HEADER : 0; i < a->len; i++) local[a->data[i]]++;
    uint64_t *bins = (uint64_t *)a->scratch;
    for (int b = 0; b < 256; b++)
        if (local[b]) __atomic_fetch_add(&bins[b], local[b], __ATOMIC_RELAXED);
    __atomic_fetch_add(&a->counters[1], a->len, __ATOMIC_RELAXED);
    return 0;
}

int histogram_tail(const cf_spin_args *a, const cf_spin_ops *ops) {
    __atomic_thread_fence(__ATOMIC_ACQUIRE);
    return ops->emit(ops->ctx, a->scratch, 256 * 8);
}
