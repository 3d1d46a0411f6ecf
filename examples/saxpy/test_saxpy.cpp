// test_saxpy - runs the HLS function natively against the host reference.
// The HLS source is an ordinary C++ function once corefarm/hls.h is
// included, so it is tested by calling it (no simulator, no cluster).
// Build: c++ -O2 -fwrapv -Iinclude examples/saxpy/test_saxpy.cpp -o test_saxpy
#include <cstdio>
#include <random>
#include <vector>

#include "saxpy.cpp"
#include "saxpy_ref.h"

int main() {
    std::mt19937 rng(1);
    std::vector<uint8_t> in(SAXPY_IN), out(SAXPY_OUT), expect(SAXPY_OUT);
    for (int round = 0; round < 100; round++) {
        for (auto &b : in) b = uint8_t(rng());
        if (round == 0) {
            int32_t big = 0x7fffffff;  // a * x + y overflows: must wrap
            std::memcpy(in.data(), &big, 4);
        }
        saxpy_ref(in.data(), expect.data());
        saxpy(reinterpret_cast<int32_t *>(in.data()), reinterpret_cast<int32_t *>(out.data()));
        if (out != expect) {
            std::printf("FAIL round %d\n", round);
            return 1;
        }
    }
    std::printf("PASS saxpy (native, 100 random inputs)\n");
    return 0;
}
