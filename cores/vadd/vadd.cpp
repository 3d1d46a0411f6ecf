// vadd - HLS hardware core: adds two vectors of N signed 8-bit elements
// (seed 000 section 3.4.1.2 example). Input: a[N] then b[N]; output a+b,
// wrapping. Compiles with the Intel HLS compiler or, through corefarm/hls.h,
// natively (entry `vadd`).
#include "corefarm/hls.h"

#define N 1024

hls_avalon_agent_component
component void vadd(
    hls_avalon_agent_memory_argument(2 * N) uint8_t* in,
    hls_avalon_agent_memory_argument(N) uint8_t* out)
{
    for (int i = 0; i < N; i++)
        out[i] = (uint8_t)((int8_t)in[i] + (int8_t)in[N + i]);
}
