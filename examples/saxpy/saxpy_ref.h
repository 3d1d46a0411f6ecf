// saxpy_ref.h - host reference of the saxpy core, written independently of
// saxpy.cpp (unsigned arithmetic: defined wrap-around). Shared by the native
// test (test_saxpy.cpp) and the RTL testbench (tb_saxpy.cpp).
#pragma once
#include <cstddef>
#include <cstdint>
#include <cstring>

constexpr size_t SAXPY_N = 256;
constexpr size_t SAXPY_IN = 8 + 2 * SAXPY_N * 4, SAXPY_OUT = SAXPY_N * 4;

inline void saxpy_ref(const uint8_t *in, uint8_t *out) {
    uint32_t a, x, y;
    std::memcpy(&a, in, 4);
    for (size_t i = 0; i < SAXPY_N; i++) {
        std::memcpy(&x, in + 8 + 4 * i, 4);
        std::memcpy(&y, in + 8 + 4 * (SAXPY_N + i), 4);
        uint32_t r = a * x + y;
        std::memcpy(out + 4 * i, &r, 4);
    }
}
