// tb_axi - testbench of the AXI (AMD/Vitis-style) reference cores through
// the RTL ABI of cf_rtl_axi_wrapper.cpp, independent of corefarm's driver:
// the ap_ctrl_hs register map (reset state, argument readback, ap_done clear
// on read, interrupt status toggle on write, the interrupt line), jobs with
// buffers placed so bursts must split at 4 KiB boundaries, results against
// the host references, and no AXI rule violation seen by the memory model.
// Also reports cycles per job, how many of them moved memory, and simulated
// cycles per second.
// Usage: tb_axi <vadd|matmul> <rtl.so> [jobs]
#include "cf_tb.h"
#include "ref.h"

using namespace cftb;

namespace {

const uint64_t kHost = 1ull << 32;
const uint32_t CTRL = 0x00, GIE = 0x04, IER = 0x08, ISR = 0x0C;
const uint32_t AP_START = 1, AP_DONE = 2, AP_IDLE = 4;

struct Axi {
    const RtlLib &L;
    void *inst;
    uint64_t (*host_bytes)(void);
    uint64_t (*mem_cycles)(void *);
    uint64_t (*axi_errors)(void *);

    Axi(const RtlLib &lib, void *h) : L(lib), inst(lib.create()) {
        if (!inst) die("cf_rtl_create returned NULL");
        host_bytes = sym<decltype(host_bytes)>(h, "cf_rtl_host_bytes");
        mem_cycles = sym<decltype(mem_cycles)>(h, "cf_rtl_mem_cycles");
        axi_errors = sym<decltype(axi_errors)>(h, "cf_rtl_axi_errors");
    }
    ~Axi() { L.destroy(inst); }

    // One 32-bit register: the half of its 64-bit word, by byteenable.
    uint32_t get(uint32_t off) {
        uint64_t w = L.read(inst, 0, off / 8);
        return off % 8 ? uint32_t(w >> 32) : uint32_t(w);
    }
    void set(uint32_t off, uint32_t v) {
        bool hi = off % 8;
        L.write(inst, 0, off / 8, hi ? uint64_t(v) << 32 : v, hi ? 0xF0 : 0x0F);
    }
    void set_ptr(uint32_t off, uint64_t addr) {
        set(off, uint32_t(addr));
        set(off + 4, uint32_t(addr >> 32));
    }
    void store(uint64_t addr, const uint8_t *p, size_t n) {
        for (size_t o = 0; o < n; o += 8) {
            uint64_t w = 0;
            size_t len = n - o < 8 ? n - o : 8;
            std::memcpy(&w, p + o, len);
            L.write(inst, 3, uint32_t((addr - kHost + o) / 8), w, uint8_t((1u << len) - 1));
        }
    }
    void load(uint64_t addr, uint8_t *p, size_t n) {
        for (size_t o = 0; o < n; o += 8) {
            uint64_t w = L.read(inst, 3, uint32_t((addr - kHost + o) / 8));
            std::memcpy(p + o, &w, n - o < 8 ? n - o : 8);
        }
    }
    // Ticks until the interrupt line rises; returns the cycles, 0 at `limit`.
    uint64_t wait_irq(uint64_t limit) {
        uint64_t t0 = L.cycles(inst);
        while (L.cycles(inst) - t0 < limit) {
            if (L.irq(inst)) return L.cycles(inst) - t0;
            L.tick(inst, 1);
        }
        return 0;
    }
    uint64_t wait_done(uint64_t limit, uint32_t poll) {
        uint64_t t0 = L.cycles(inst);
        while (L.cycles(inst) - t0 < limit) {
            if (get(CTRL) & AP_DONE) return L.cycles(inst) - t0;
            L.tick(inst, poll);
        }
        return 0;
    }
};

struct Core {
    const char *top;
    size_t a, b, c;  // bytes of the two inputs and the output
    uint64_t limit;
    bool scalar_n;   // vadd's fourth argument, n at 0x34
    void (*ref)(const uint8_t *, uint8_t *);
};

}  // namespace

int main(int argc, char **argv) {
    if (argc < 3) die("usage: %s <vadd|matmul> <rtl.so> [jobs]", argv[0]);
    std::string which = argv[1];
    Core k;
    if (which == "vadd")
        k = {"vadd", VADD_N, VADD_N, VADD_N, 20000, true, vadd_ref};
    else if (which == "matmul")
        k = {"mat_mul_64x64", MM_OUT, MM_OUT, MM_OUT, 400000, false, matmul_ref};
    else
        die("unknown core %s", which.c_str());
    int jobs = argc > 3 ? std::atoi(argv[3]) : 3;
    std::mt19937_64 rng(7);
    void *h = open_lib(argv[2]);
    RtlLib L(argv[2]);
    CHECK(std::strcmp(L.top_name(), k.top) == 0, "top name %s", L.top_name());
    Axi x(L, h);
    CHECK(x.host_bytes() >= 64 * 1024, "host memory of %llu bytes",
          (unsigned long long)x.host_bytes());

    // Reset state: idle, nothing started or done, interrupts off.
    CHECK(x.get(CTRL) == AP_IDLE, "control after reset %#x", x.get(CTRL));
    CHECK(x.get(GIE) == 0 && x.get(IER) == 0 && x.get(ISR) == 0, "interrupt registers");
    CHECK(L.irq(x.inst) == 0, "irq after reset");

    // Buffers at odd places: a starts 8 bytes before a 4 KiB boundary, so
    // every burst plan must split there.
    uint64_t pa = kHost + 0x0FF8, pb = kHost + 0x9000, pc = kHost + 0x12000 - 16;
    x.set_ptr(0x10, pa);
    x.set_ptr(0x1C, pb);
    x.set_ptr(0x28, pc);
    if (k.scalar_n) x.set(0x34, uint32_t(VADD_N));
    CHECK(x.get(0x10) == uint32_t(pa) && x.get(0x14) == 1, "pointer readback");
    CHECK(x.get(0x2C) == 1, "pointer high word");

    std::vector<uint8_t> in(k.a + k.b), out(k.c), expect(k.c);
    uint64_t total = 0, mem = 0;
    for (int j = 0; j < jobs; j++) {
        in = random_bytes(rng, in.size());
        k.ref(in.data(), expect.data());
        x.store(pa, in.data(), k.a);
        x.store(pb, in.data() + k.a, k.b);
        bool irq = j % 2 == 0;
        x.set(GIE, irq);
        x.set(IER, irq);
        uint64_t m0 = x.mem_cycles(x.inst), c0 = L.cycles(x.inst);
        x.set(CTRL, AP_START);
        uint64_t t = irq ? x.wait_irq(k.limit) : x.wait_done(k.limit, 16);
        CHECK(t > 0, "job %d did not finish", j);
        uint64_t c1 = L.cycles(x.inst);
        total += c1 - c0;
        mem += x.mem_cycles(x.inst) - m0;
        if (irq) {
            CHECK(x.get(ISR) == 1, "status after done %#x", x.get(ISR));
            uint32_t ctrl = x.get(CTRL);
            CHECK((ctrl & (AP_DONE | AP_IDLE)) == (AP_DONE | AP_IDLE), "control %#x", ctrl);
            CHECK((x.get(CTRL) & AP_DONE) == 0, "ap_done not cleared by the read");
            x.set(ISR, 1);  // toggle: clears
            CHECK(x.get(ISR) == 0 && L.irq(x.inst) == 0, "status toggle did not clear");
            x.set(ISR, 0);
            CHECK(x.get(ISR) == 0, "writing 0 toggled the status");
        } else {
            CHECK(L.irq(x.inst) == 0, "irq with interrupts off");
        }
        x.load(pc, out.data(), out.size());
        CHECK(first_diff(out, expect) < 0, "job %d differs at byte %ld", j,
              first_diff(out, expect));
    }
    CHECK(x.axi_errors(x.inst) == 0, "%llu AXI rule violations",
          (unsigned long long)x.axi_errors(x.inst));

    // ap_start reads 1 only until the core takes the job; reset leaves an
    // idle core.
    x.set(GIE, 0);
    x.set(CTRL, AP_START);
    uint32_t ctrl = x.get(CTRL);
    CHECK((ctrl & (AP_START | AP_IDLE)) == 0, "control while running %#x", ctrl);
    CHECK(x.wait_done(k.limit, 16) > 0, "last job did not finish");
    L.reset(x.inst);
    CHECK(x.get(CTRL) == AP_IDLE, "control after reset %#x", x.get(CTRL));
    CHECK(x.axi_errors(x.inst) == 0, "AXI rule violations");

    double t0 = now_seconds();
    uint64_t c0 = L.cycles(x.inst);
    L.tick(x.inst, 2000000);
    double t1 = now_seconds();
    std::printf("%s axi: %.0f cycles/job, %.0f of them with master traffic (%.1f%%), "
                "%.2f M cycles/s (tick loop)\n",
                which.c_str(), double(total) / jobs, double(mem) / jobs, 100.0 * mem / total,
                (L.cycles(x.inst) - c0) / (t1 - t0) / 1e6);
    return finish("tb_axi");
}
