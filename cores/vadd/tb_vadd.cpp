// tb_vadd - testbench of the Verilog vadd core through the RTL ABI.
// Usage: tb_vadd <vadd RTL .so> [seed]
#include "cf_tb.h"
#include "ref.h"

using namespace cftb;

int main(int argc, char **argv) {
    if (argc < 2) die("usage: %s <rtl.so> [seed]", argv[0]);
    std::mt19937_64 rng(argc > 2 ? std::strtoull(argv[2], nullptr, 0) : 1);
    RtlLib L(argv[1]);
    // 128 words at one word per cycle, plus a little pipeline slack.
    check_csr_and_job(L, "vadd", VADD_IN, VADD_OUT, 200, vadd_ref, rng);

    // Extremes wrap: 127 + 1 = -128, -128 + -1 = 127.
    Rtl c(L);
    std::vector<uint8_t> in(VADD_IN), out(VADD_OUT), expect(VADD_OUT);
    for (size_t i = 0; i < VADD_N; i++) {
        in[i] = i % 2 ? 0x80 : 0x7f;
        in[VADD_N + i] = i % 2 ? 0xff : 0x01;
    }
    vadd_ref(in.data(), expect.data());
    CHECK(c.run(in, out, 200) > 0, "wrap job did not finish");
    CHECK(out[0] == 0x80 && out[1] == 0x7f, "wrap: %02x %02x", out[0], out[1]);
    CHECK(first_diff(out, expect) < 0, "wrap job differs at %ld", first_diff(out, expect));

    // Many random jobs back to back on one instance.
    for (int job = 0; job < 50; job++) {
        in = random_bytes(rng, VADD_IN);
        vadd_ref(in.data(), expect.data());
        CHECK(c.run(in, out, 200, 16) > 0, "job %d did not finish", job);
        CHECK(first_diff(out, expect) < 0, "job %d differs at %ld", job, first_diff(out, expect));
    }
    return finish("tb_vadd");
}
