// test_hls_native - checks the natively compiled HLS reference cores (the
// native soft-core ABI) against the host references on random and edge data.
// Usage: test_hls_native vadd|matmul <core .so> [seed]
#include "cf_tb.h"
#include "ref.h"

using namespace cftb;

typedef void (*Entry)(const uint8_t *, uint8_t *);

int main(int argc, char **argv) {
    if (argc < 3) die("usage: %s vadd|matmul <core.so> [seed]", argv[0]);
    std::mt19937_64 rng(argc > 3 ? std::strtoull(argv[3], nullptr, 0) : 1);
    std::string which = argv[1];
    void *h = open_lib(argv[2]);
    size_t in_size, out_size;
    void (*ref)(const uint8_t *, uint8_t *);
    Entry entry;
    if (which == "vadd") {
        entry = sym<Entry>(h, "vadd");
        in_size = VADD_IN, out_size = VADD_OUT, ref = vadd_ref;
    } else if (which == "matmul") {
        entry = sym<Entry>(h, "mat_mul_64x64");
        in_size = MM_IN, out_size = MM_OUT, ref = matmul_ref;
    } else {
        die("unknown core %s", which.c_str());
    }
    std::vector<uint8_t> out(out_size), expect(out_size);
    for (int round = 0; round < 20; round++) {
        std::vector<uint8_t> in;
        if (round == 0) {
            in.assign(in_size, 0);
        } else if (round == 1) {
            // Extremes (0x80.., 0x7f.., 0xff..) exercise wrap-around.
            in.resize(in_size);
            for (auto &b : in) b = (rng() % 3 == 0) ? 0x80 : (rng() % 2 ? 0x7f : 0xff);
        } else {
            in = random_bytes(rng, in_size);
        }
        ref(in.data(), expect.data());
        std::fill(out.begin(), out.end(), 0xa5);  // stale output must be overwritten
        entry(in.data(), out.data());
        CHECK(first_diff(out, expect) < 0, "%s round %d differs at byte %ld", which.c_str(),
              round, first_diff(out, expect));
    }
    return finish(("test_hls_native " + which).c_str());
}
