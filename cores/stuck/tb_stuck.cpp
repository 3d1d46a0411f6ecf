// tb_stuck - testbench of the hanging test core: start is accepted, busy
// rises and stays, done and irq never rise, reset recovers.
// Usage: tb_stuck <stuck RTL .so>
#include "cf_tb.h"

using namespace cftb;

int main(int argc, char **argv) {
    if (argc < 2) die("usage: %s <rtl.so>", argv[0]);
    RtlLib L(argv[1]);
    CHECK(L.abi_version() == 1, "abi version");
    CHECK(std::strcmp(L.top_name(), "stuck") == 0, "top name %s", L.top_name());
    Rtl c(L);
    CHECK(!c.busy() && !c.done(), "idle after reset");
    std::vector<uint8_t> in = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16}, back(16);
    c.store(IN, in.data(), in.size());
    c.load(IN, back.data(), back.size());
    CHECK(back == in, "input memory round trip");
    c.store(OUT, in.data(), in.size());
    c.load(OUT, back.data(), back.size());
    CHECK(back == in, "output memory round trip");
    c.set(IE, 1);
    c.start();
    CHECK(c.busy(), "busy after start");
    CHECK(c.wait_done(1000000, 1000) == 0, "stuck core raised done");
    CHECK(c.busy(), "busy dropped");
    CHECK(L.irq(c.inst) == 0, "irq raised");
    c.start();
    CHECK(c.busy() && !c.done(), "second start changed state");
    L.reset(c.inst);
    CHECK(!c.busy() && !c.done(), "reset did not recover");
    return finish("tb_stuck");
}
