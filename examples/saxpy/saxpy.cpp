// saxpy - example corefarm hardware core (docs/writing-a-core.md):
// out[i] = a * x[i] + y[i] over N = 256 signed 32-bit integers, wrapping.
//
// Input memory (2056 bytes): a (int32) and 4 padding bytes, then x[256],
// then y[256]; little-endian. Output memory (1024 bytes): out[256].
// The padding keeps x and y on 64-bit word boundaries, which makes the
// Verilog form (saxpy.v) read two lanes per word.
#include "corefarm/hls.h"

#define N 256

hls_avalon_agent_component
component void saxpy(
    hls_avalon_agent_memory_argument(8 + 2 * N * 4) int32_t *in,
    hls_avalon_agent_memory_argument(N * 4) int32_t *out)
{
    int32_t a = in[0];
    const int32_t *x = in + 2, *y = in + 2 + N;
    for (int i = 0; i < N; i++)
        out[i] = a * x[i] + y[i];  // wraps: corefarm compiles with -fwrapv
}
