// vadd (AMD/Vitis HLS style) - c[i] = a[i] + b[i] (int8, wrapping) for i < n.
//
// The same function as vadd.cpp, written as a Vitis HLS top function: the
// vectors are m_axi pointers into host memory (the core reads a and b and
// writes c itself), n and the start/done handshake (ap_ctrl_hs) are on the
// s_axi_control slave. vadd_axi.v is what Vitis makes of it. corefarm reads
// the interface from the signature and the pragmas: `const` pointers are
// inputs, the others outputs, each `depth` elements. A C++ compiler ignores
// the pragmas, so the same file is the native soft core
// (`corefarm image build --hls vadd_vitis.cpp --entry vadd --family amd
// --scalar n=1024`).
#include <stdint.h>

void vadd(const int8_t *a, const int8_t *b, int8_t *c, int n) {
#pragma HLS INTERFACE m_axi port=a depth=1024 offset=slave bundle=gmem
#pragma HLS INTERFACE m_axi port=b depth=1024 offset=slave bundle=gmem
#pragma HLS INTERFACE m_axi port=c depth=1024 offset=slave bundle=gmem
#pragma HLS INTERFACE s_axilite port=n
#pragma HLS INTERFACE s_axilite port=return
    for (int i = 0; i < n; i++) {
#pragma HLS PIPELINE II=1
        c[i] = (int8_t)(a[i] + b[i]);
    }
}
