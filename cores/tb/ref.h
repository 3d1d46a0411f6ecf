// ref.h - host reference computations of the reference cores, written
// independently of the HLS sources (unsigned arithmetic = defined wrap).
#ifndef CF_TB_REF_H
#define CF_TB_REF_H
#include <cstdint>
#include <cstring>

namespace cftb {

constexpr size_t VADD_N = 1024;
constexpr size_t VADD_IN = 2 * VADD_N, VADD_OUT = VADD_N;

inline void vadd_ref(const uint8_t *in, uint8_t *out) {
    for (size_t i = 0; i < VADD_N; i++) out[i] = uint8_t(in[i] + in[VADD_N + i]);
}

constexpr size_t MM_D = 64;
constexpr size_t MM_IN = 2 * MM_D * MM_D * 4, MM_OUT = MM_D * MM_D * 4;

inline uint32_t le32(const uint8_t *p) {
    return uint32_t(p[0]) | uint32_t(p[1]) << 8 | uint32_t(p[2]) << 16 | uint32_t(p[3]) << 24;
}

inline void matmul_ref(const uint8_t *in, uint8_t *out) {
    const uint8_t *a = in, *b = in + MM_D * MM_D * 4;
    for (size_t i = 0; i < MM_D; i++)
        for (size_t j = 0; j < MM_D; j++) {
            uint32_t acc = 0;
            for (size_t k = 0; k < MM_D; k++)
                acc += le32(a + 4 * (i * MM_D + k)) * le32(b + 4 * (k * MM_D + j));
            uint8_t *o = out + 4 * (i * MM_D + j);
            for (int s = 0; s < 4; s++) o[s] = uint8_t(acc >> (8 * s));
        }
}

}  // namespace cftb
#endif
