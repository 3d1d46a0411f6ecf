// nbody - the core of the N-body-style example (docs/collectives.md), in
// integer fixed point so every run is bit-exact: N = 64 bodies moving on a
// line, each pulled toward every other. Input memory (520 bytes): this
// body (int32 x, int32 v), then every body's (x, v) in body order (the
// group's allgather of this step). Output (8 bytes): the body one step
// later: v += sum_j (x_j - x) >> 6, x += v.
#include "corefarm/hls.h"

#define N 64

hls_avalon_agent_component
component void nbody(
    hls_avalon_agent_memory_argument(8 + N * 8) int32_t *in,
    hls_avalon_agent_memory_argument(8) int32_t *out)
{
    int32_t x = in[0], v = in[1];
    int32_t pull = 0;
    for (int j = 0; j < N; j++)
        pull += in[2 + 2 * j] - x;  // wraps: corefarm compiles with -fwrapv
    v += pull >> 6;
    out[0] = x + v;
    out[1] = v;
}
