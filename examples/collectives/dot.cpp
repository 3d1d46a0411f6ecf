// dot - the core of the distributed matrix-vector example
// (docs/collectives.md): out = row . v over K = 64 signed 32-bit integers,
// wrapping. Input memory (512 bytes): row[64] then v[64]; the group's `run`
// appends the broadcast vector v to every row it holds. Output: one int32.
#include "corefarm/hls.h"

#define K 64

hls_avalon_agent_component
component void dot(
    hls_avalon_agent_memory_argument(2 * K * 4) int32_t *in,
    hls_avalon_agent_memory_argument(4) int32_t *out)
{
    int32_t acc = 0;
    for (int i = 0; i < K; i++)
        acc += in[i] * in[K + i];  // wraps: corefarm compiles with -fwrapv
    out[0] = acc;
}
