// Software baseline of seed 000 §4.5: the 64x64 signed 32-bit matrix
// multiplication with the same naive algorithm as the HLS core (§4.3.2.1),
// timed on the CPU. Prints one JSON object.
//
//   c++ -O3 -o matmul matmul.cpp && ./matmul [seconds]
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>

constexpr int N = 64;
constexpr std::size_t IN_BYTES = 2 * N * N * sizeof(int32_t);   // 32768, as the core's input
constexpr std::size_t OUT_BYTES = N * N * sizeof(int32_t);      // 16384

static void mat_mul_64x64(const int32_t *in, int32_t *out) {
    for (int i = 0; i < N * N; i++) out[i] = 0;
    for (int i = 0; i < N; i++)
        for (int j = 0; j < N; j++)
            for (int k = 0; k < N; k++)
                out[j + i * N] += in[k + i * N] * in[N * N + j + k * N];
}

int main(int argc, char **argv) {
    double seconds = argc > 1 ? std::atof(argv[1]) : 3.0;
    // A pool of distinct inputs so the loop is not a cache-resident replay of one.
    const int POOL = 64;
    std::vector<int32_t> in(POOL * 2 * N * N), out(N * N);
    uint32_t x = 12345;
    for (auto &v : in) { x = x * 1664525u + 1013904223u; v = int32_t(x >> 8) - (1 << 23); }
    using clk = std::chrono::steady_clock;
    auto start = clk::now();
    long long mults = 0;
    uint64_t check = 0;
    double elapsed = 0;
    while (elapsed < seconds) {
        for (int r = 0; r < 16; r++, mults++) {
            mat_mul_64x64(&in[(mults % POOL) * 2 * N * N], out.data());
            check += uint32_t(out[mults % (N * N)]);  // keeps the work observable
        }
        elapsed = std::chrono::duration<double>(clk::now() - start).count();
    }
    double bps = mults * double(IN_BYTES) / elapsed;
    std::printf("{\"multiplications\": %lld, \"seconds\": %.6f, \"input_bytes_per_s\": %.1f, "
                "\"output_bytes_per_s\": %.1f, \"us_per_multiplication\": %.3f, \"checksum\": %llu}\n",
                mults, elapsed, bps, mults * double(OUT_BYTES) / elapsed, elapsed * 1e6 / mults,
                (unsigned long long)check);
    return 0;
}
