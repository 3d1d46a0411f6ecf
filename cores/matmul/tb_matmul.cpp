// tb_matmul - testbench of the Verilog 64x64 matrix multiplier through the
// RTL ABI; also reports simulated cycles per second of one instance.
// Usage: tb_matmul <mat_mul_64x64 RTL .so> [seed]
#include "cf_tb.h"
#include "ref.h"

using namespace cftb;

static const uint64_t kJobMax = 64 * 64 * 64 + 64;

int main(int argc, char **argv) {
    if (argc < 2) die("usage: %s <rtl.so> [seed]", argv[0]);
    std::mt19937_64 rng(argc > 2 ? std::strtoull(argv[2], nullptr, 0) : 1);
    RtlLib L(argv[1]);
    check_csr_and_job(L, "mat_mul_64x64", MM_IN, MM_OUT, kJobMax, matmul_ref, rng);

    // Structured inputs: A = identity gives B back; extremes wrap.
    Rtl c(L);
    std::vector<uint8_t> in(MM_IN), out(MM_OUT), expect(MM_OUT);
    in = random_bytes(rng, MM_IN);
    std::memset(in.data(), 0, MM_D * MM_D * 4);
    for (size_t i = 0; i < MM_D; i++) in[4 * (i * MM_D + i)] = 1;
    CHECK(c.run(in, out, kJobMax) > 0, "identity job did not finish");
    CHECK(std::memcmp(out.data(), in.data() + MM_D * MM_D * 4, MM_OUT) == 0,
          "I * B != B");
    for (size_t e = 0; e < 2 * MM_D * MM_D; e++) {
        static const uint32_t vals[] = {0x80000000u, 0x7fffffffu, 0xffffffffu, 1u};
        uint32_t v = vals[rng() % 4];
        std::memcpy(&in[4 * e], &v, 4);
    }
    matmul_ref(in.data(), expect.data());
    CHECK(c.run(in, out, kJobMax) > 0, "extremes job did not finish");
    CHECK(first_diff(out, expect) < 0, "extremes job differs at %ld", first_diff(out, expect));

    // Two instances interleaved stay independent.
    Rtl d(L);
    std::vector<uint8_t> in2 = random_bytes(rng, MM_IN), out2(MM_OUT), expect2(MM_OUT);
    matmul_ref(in2.data(), expect2.data());
    c.store(IN, in.data(), in.size());
    d.store(IN, in2.data(), in2.size());
    c.start();
    d.start();
    for (int i = 0; i < 64 * 65; i++) {
        L.tick(c.inst, 64);
        L.tick(d.inst, 64);
    }
    CHECK(c.done() && d.done(), "interleaved instances not done");
    c.load(OUT, out.data(), out.size());
    d.load(OUT, out2.data(), out2.size());
    CHECK(first_diff(out, expect) < 0, "instance c differs at %ld", first_diff(out, expect));
    CHECK(first_diff(out2, expect2) < 0, "instance d differs at %ld", first_diff(out2, expect2));

    // Throughput of one instance: whole jobs (bus transfers, polling every
    // 4096 cycles) and the bare tick loop. Reported, not asserted.
    c.clear_done();
    const int jobs = 20;
    uint64_t c0 = L.cycles(c.inst);
    double t0 = now_seconds();
    for (int j = 0; j < jobs; j++) CHECK(c.run(in2, out2, 2 * kJobMax, 4096) > 0, "bench job");
    double t1 = now_seconds();
    uint64_t c1 = L.cycles(c.inst);
    L.tick(c.inst, 20000000);
    double t2 = now_seconds();
    std::printf("matmul: %d jobs in %.3f s = %.1f jobs/s, %.2f M cycles/s (jobs incl. bus), "
                "%.2f M cycles/s (tick loop)\n",
                jobs, t1 - t0, jobs / (t1 - t0), (c1 - c0) / (t1 - t0) / 1e6,
                20000000 / (t2 - t1) / 1e6);
    return finish("tb_matmul");
}
