/* Handler sets that misbehave on purpose, for the isolation tests (not
 * reference handlers): `crash` dereferences a null pointer in its payload
 * handler, `hang` never returns from its head, `greedy` emits more than
 * any small output budget allows; `never` is selected by a rule that
 * matches nothing, so its tail must never run. */
#include <corefarm/spin.h>

/* volatile: the compiler cannot know it stays NULL. */
static uint8_t *volatile nowhere;

int crash_payload(const cf_spin_args *a, const cf_spin_ops *ops) {
    (void)a;
    (void)ops;
    *nowhere = 1;
    return 0;
}

int hang_head(const cf_spin_args *a, const cf_spin_ops *ops) {
    (void)a;
    (void)ops;
    volatile uint64_t n = 0;
    for (;;) n++;
    return 0;
}

int greedy_payload(const cf_spin_args *a, const cf_spin_ops *ops) {
    static const uint8_t zeros[4096];
    for (int i = 0; i < 64; i++)
        if (ops->emit(ops->ctx, zeros, sizeof zeros) != 0) return 0; /* the engine fails the message */
    (void)a;
    return 0;
}

int never_tail(const cf_spin_args *a, const cf_spin_ops *ops) {
    (void)a;
    return ops->emit(ops->ctx, (const uint8_t *)"never", 5);
}
