// tb_mycore - the generic CSR and job checks of cores/tb/cf_tb.h on the
// template. Build: c++ -O2 -std=c++17 -Icores/tb examples/template/tb_mycore.cpp -o tb_mycore -ldl
// Usage: tb_mycore <mycore RTL .so>
#include "cf_tb.h"

int main(int argc, char **argv) {
    if (argc < 2) cftb::die("usage: %s <rtl.so>", argv[0]);
    std::mt19937_64 rng(1);
    cftb::RtlLib L(argv[1]);
    auto invert = [](const uint8_t *in, uint8_t *out) {
        for (int i = 0; i < 1024; i++) out[i] = uint8_t(~in[i]);
    };
    cftb::check_csr_and_job(L, "mycore", 1024, 1024, 200, invert, rng);
    return cftb::finish("tb_mycore");
}
