// tb_saxpy - testbench of saxpy.v through the RTL simulation ABI, using the
// generic checks of cores/tb/cf_tb.h (reset state, CSR rules, byteenable,
// out-of-range accesses, start while busy, sticky done, reset while busy).
// Build: c++ -O2 -std=c++17 -Icores/tb examples/saxpy/tb_saxpy.cpp -o tb_saxpy -ldl
// Usage: tb_saxpy <saxpy RTL .so>
#include "cf_tb.h"
#include "saxpy_ref.h"

using namespace cftb;

int main(int argc, char **argv) {
    if (argc < 2) die("usage: %s <rtl.so>", argv[0]);
    std::mt19937_64 rng(7);
    RtlLib L(argv[1]);
    // 128 output words at one per cycle, plus slack for the bus cycles.
    check_csr_and_job(L, "saxpy", SAXPY_IN, SAXPY_OUT, 200, saxpy_ref, rng);

    Rtl c(L);
    std::vector<uint8_t> in(SAXPY_IN), out(SAXPY_OUT), expect(SAXPY_OUT);
    for (int job = 0; job < 50; job++) {
        in = random_bytes(rng, SAXPY_IN);
        saxpy_ref(in.data(), expect.data());
        uint64_t cycles = c.run(in, out, 200, 16);
        CHECK(cycles > 0, "job %d did not finish", job);
        CHECK(first_diff(out, expect) < 0, "job %d differs at byte %ld", job,
              first_diff(out, expect));
    }
    return finish("tb_saxpy");
}
