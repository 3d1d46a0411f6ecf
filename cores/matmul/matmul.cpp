// mat_mul_64x64 - HLS hardware core of seed 000 section 4.3.2.1, as given
// there: naive 64x64 signed 32-bit matrix multiplication. Input: A then B,
// row-major int32; output A*B (wrapping). Compiles with the Intel HLS
// compiler or, through corefarm/hls.h, natively (entry `mat_mul_64x64`).
#include "corefarm/hls.h"

#define A_M 64
#define A_N 64
#define B_M 64
#define B_N 64
hls_avalon_agent_component
component void mat_mul_64x64
(
    hls_avalon_agent_memory_argument((A_M*A_N + B_M*B_N) * sizeof(int))
        int* in,
    hls_avalon_agent_memory_argument(A_M*B_N * sizeof(int))
        int* out
    )
{
  for(int i=0; i < A_M * B_N; i++)
    out[i] = 0;
  for(int i=0; i < A_M; i++)
    for(int j=0; j < B_N; j++)
     for(int k=0; k < B_M; k++)
      out[j + i * B_N] += in[k + i * A_N] * in[(A_M*A_N) + j + k * B_N];
}
