/* corefarm streaming handlers: the sPIN programming model (seed 004,
 * FPsPIN) for data messages that stream through a node.
 *
 * A handler set is three C functions in a shared object, named
 * <set>_head, <set>_payload and <set>_tail (any may be absent):
 *
 *   head     once per message, on its first chunk, before any payload handler;
 *   payload  once per chunk (the first chunk included), in parallel with the
 *            payload handlers of other chunks of the same message;
 *   tail     once per message, after every payload handler of it returned.
 *
 * Each gets a cf_spin_args describing the message and the chunk, and
 * cf_spin_ops, the actions it may take. A handler returns 0 on success;
 * anything else fails the message (the user gets an error naming the
 * handler and the code) and the node carries on with other messages.
 *
 * Memory: `scratch` is the message's own state (zeroed before head, freed
 * after tail), `shared` is the handler set's memory kept across messages;
 * `counters` are 64-bit counters of the handler set, kept likewise. Sizes
 * are the budgets the image declared; writing past them is a fault (or,
 * within the last page, lands in padding nobody reads).
 *
 * Concurrency: payload handlers of one message run concurrently with each
 * other, and handlers of *different messages* run concurrently too — a
 * node runs several messages at once, each in one of a pool of worker
 * processes that all map the same `shared` memory and `counters`. So:
 *   - every update of `scratch`, `shared` or `counters` must be atomic
 *     (__atomic builtins, e.g. __atomic_fetch_add(&a->counters[0], 1,
 *     __ATOMIC_RELAXED), or C11 <stdatomic.h>); a plain `+=` loses counts;
 *   - no lock of the C library or of your own code protects `shared`
 *     across messages (the other messages run in other processes), and a
 *     spin lock in `shared` is held forever if its holder crashes;
 *   - static and global variables of the handler object are per worker
 *     process, not per handler set: use `shared` for state all messages
 *     must see;
 *   - `shared` and `counters` survive a crashed handler (a replaced
 *     worker maps the same memory), including a half-done update.
 *
 * Output: `emit` appends bytes to the message's result. The result is
 * ordered by chunk, whatever order the handlers ran in: head's output
 * first, then each chunk's payload output by chunk offset, then tail's.
 * The user gets exactly those bytes, of any length up to the output budget
 * and one message (hello feature `any-length`); a client without that
 * feature gets them zero-padded to inputs x output size, and a longer
 * result fails its message for it (docs/streams.md, "Results").
 * Without emit, forward or drop, the message goes to the hardware cores
 * as if no handler had matched.
 *
 * Packaging: list the set in an image's `handler_sets` and build its
 * sources into the image (`corefarm image build --handlers sets.json
 * --handler-source file.c ...`, docs/streams.md). A node runs handlers in
 * a pool of worker processes, one message at a time each: a handler that
 * crashes or outruns its time budget fails its message, and the node
 * carries on.
 */
#ifndef COREFARM_SPIN_H
#define COREFARM_SPIN_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct cf_spin_args {
    uint32_t message_id;      /* the data message's id */
    uint32_t chunk_index;     /* 0-based; head and tail see 0 and the count */
    uint64_t offset;          /* byte offset of this chunk in the message data */
    uint64_t message_len;     /* whole message data length, if known, else 0 */
    const uint8_t *data;      /* this chunk (NULL for the tail) */
    uint32_t len;             /* bytes in this chunk */
    uint32_t eom;             /* 1 on the last chunk */
    uint8_t *scratch;         /* per-message state, zeroed before head */
    uint32_t scratch_len;
    uint32_t counters_len;    /* number of counters */
    uint8_t *shared;          /* the handler set's memory, kept across messages */
    uint64_t shared_len;
    uint64_t *counters;       /* the handler set's counters */
} cf_spin_args;

typedef struct cf_spin_ops {
    void *ctx; /* pass to every action */
    /* Appends `len` bytes to the message's result; 0, or -1 past the
     * output budget (the message then fails). */
    int (*emit)(void *ctx, const uint8_t *bytes, uint32_t len);
    /* After the tail, hand the whole message to the hardware cores. */
    void (*forward)(void *ctx);
    /* The message produces no result (the user gets an empty one; zeros
     * of the fixed size without `any-length`). */
    void (*drop)(void *ctx);
    /* Sends the user a notification of `len` bytes (at most 4 KiB, else
     * -1 and the message fails); 0 on success. The user receives it
     * (recv_notification) before the message's result or error; a node
     * keeps at most 256 per message (docs/streams.md, "Notifications"). */
    int (*notify)(void *ctx, const uint8_t *bytes, uint32_t len);
} cf_spin_ops;

typedef int (*cf_spin_handler)(const cf_spin_args *args, const cf_spin_ops *ops);

#ifdef __cplusplus
}
#endif

#endif /* COREFARM_SPIN_H */
