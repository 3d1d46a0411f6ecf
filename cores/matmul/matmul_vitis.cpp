// mat_mul_64x64 (AMD/Vitis HLS style) - C = A * B, 64x64 int32, wrapping.
//
// The same function as matmul.cpp, written as a Vitis HLS top function: A,
// B and C are m_axi pointers into host memory, the start/done handshake
// (ap_ctrl_hs) is on the s_axi_control slave. The core copies A and B into
// local memory with bursts, multiplies, and writes C back, which is what
// matmul_axi.v does. The job's input is A then B (32768 bytes), its output
// C (16384 bytes), exactly as for the Intel-style core.
#include <stdint.h>
#include <string.h>

#define N 64

void mat_mul_64x64(const int32_t *A, const int32_t *B, int32_t *C) {
#pragma HLS INTERFACE m_axi port=A depth=4096 offset=slave bundle=gmem
#pragma HLS INTERFACE m_axi port=B depth=4096 offset=slave bundle=gmem
#pragma HLS INTERFACE m_axi port=C depth=4096 offset=slave bundle=gmem
#pragma HLS INTERFACE s_axilite port=return
    int32_t a[N][N], b[N][N];
    memcpy(a, A, sizeof a);
    memcpy(b, B, sizeof b);
    for (int i = 0; i < N; i++)
        for (int j = 0; j < N; j++) {
#pragma HLS PIPELINE II=1
            int32_t acc = 0;
            for (int k = 0; k < N; k++) acc += a[i][k] * b[k][j];
            C[i * N + j] = acc;
        }
}
