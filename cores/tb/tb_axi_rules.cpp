// tb_axi_rules - the AXI wrapper's memory model against a master that breaks
// the rules on purpose: cf_rtl_axi_wrapper.cpp compiled with the scripted top
// of fake_top/ (no Verilator), so every violation tb_axi.cpp requires to be
// absent is shown to be detected. Usage: tb_axi_rules (built with
// -Icores/tb/fake_top -Icores/tb, the wrapper included below).
#include "cf_rtl_axi_wrapper.cpp"
#include "cf_tb.h"

using namespace cftb;

namespace {

const uint64_t kBase = 1ull << 32;

struct Run {
    Instance *in;
    Vcftop *t;
    Run() : in(static_cast<Instance *>(cf_rtl_create())), t(in->top) {}
    ~Run() { cf_rtl_destroy(in); }
    uint64_t errors() { return cf_rtl_axi_errors(in); }
    // Seeds the model's stall pattern so that the next ready it draws is 0.
    void stall_next() {
        for (uint32_t seed = 1;; seed++) {
            uint32_t x = seed;
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            if ((x & 3) == 0) {
                in->lfsr = seed;
                return;
            }
        }
    }
    void tick() { cf_rtl_tick(in, 1); }
    // Drives an AR request until its handshake; returns whether it happened.
    bool ar(uint64_t addr, unsigned len) {
        t->m_axi_gmem_ARVALID = 1;
        t->m_axi_gmem_ARADDR = addr;
        t->m_axi_gmem_ARLEN = len;
        t->m_axi_gmem_ARSIZE = 3;
        t->m_axi_gmem_ARBURST = 1;
        for (int i = 0; i < 100; i++) {
            tick();
            if (t->m_axi_gmem_ARREADY) {  // ready was high at that edge: taken
                t->m_axi_gmem_ARVALID = 0;
                return true;
            }
        }
        return false;
    }
};

}  // namespace

int main() {
    // A correct burst: no error, the data of host memory, RLAST on the last beat.
    {
        Run r;
        for (uint32_t w = 0; w < 4; w++) cf_rtl_write(r.in, 3, w, 0x1111111111111111ull * (w + 1), 0xff);
        CHECK(r.ar(kBase, 3), "AR not accepted");
        r.t->m_axi_gmem_RREADY = 1;
        std::vector<uint64_t> beats;
        bool last = false;
        for (int i = 0; i < 100 && !last; i++) {
            r.tick();
            if (r.t->m_axi_gmem_RVALID) {
                beats.push_back(r.t->m_axi_gmem_RDATA);
                last = r.t->m_axi_gmem_RLAST;
            }
        }
        CHECK(beats.size() == 4 && last, "%zu beats, last %d", beats.size(), last);
        for (size_t i = 0; i < beats.size(); i++)
            CHECK(beats[i] == 0x1111111111111111ull * (i + 1), "beat %zu", i);
        CHECK(r.errors() == 0, "%llu errors on a correct burst", (unsigned long long)r.errors());
    }
    // ARVALID dropped before ARREADY.
    {
        Run r;
        r.t->m_axi_gmem_ARVALID = 1;
        r.t->m_axi_gmem_ARADDR = kBase;
        r.t->m_axi_gmem_ARSIZE = 3;
        r.t->m_axi_gmem_ARBURST = 1;
        r.stall_next();
        r.tick();
        CHECK(!r.t->m_axi_gmem_ARREADY, "no stall to test with");
        r.t->m_axi_gmem_ARVALID = 0;
        r.tick();
        CHECK(r.errors() == 1, "dropped valid: %llu errors", (unsigned long long)r.errors());
    }
    // The address changed while waiting for ARREADY.
    {
        Run r;
        r.t->m_axi_gmem_ARVALID = 1;
        r.t->m_axi_gmem_ARADDR = kBase;
        r.t->m_axi_gmem_ARSIZE = 3;
        r.t->m_axi_gmem_ARBURST = 1;
        r.stall_next();
        r.tick();
        CHECK(!r.t->m_axi_gmem_ARREADY, "no stall to test with");
        r.t->m_axi_gmem_ARADDR = kBase + 8;
        r.tick();
        CHECK(r.errors() == 1, "changed payload: %llu errors", (unsigned long long)r.errors());
    }
    // A burst crossing a 4 KiB boundary, and one past the memory.
    {
        Run r;
        r.t->m_axi_gmem_RREADY = 1;
        CHECK(r.ar(kBase + 4096 - 16, 3), "AR not accepted");
        CHECK(r.errors() == 1, "4 KiB crossing: %llu errors", (unsigned long long)r.errors());
        CHECK(r.ar(kBase + cf_rtl_host_bytes() - 8, 0) && r.errors() == 1, "last word refused");
        CHECK(r.ar(kBase + cf_rtl_host_bytes(), 0) && r.errors() == 2, "past the memory: %llu",
              (unsigned long long)r.errors());
    }
    // WLAST on the first of two beats.
    {
        Run r;
        Vcftop *t = r.t;
        t->m_axi_gmem_AWVALID = 1;
        t->m_axi_gmem_AWADDR = kBase;
        t->m_axi_gmem_AWLEN = 1;
        t->m_axi_gmem_AWSIZE = 3;
        t->m_axi_gmem_AWBURST = 1;
        for (int i = 0; i < 100 && t->m_axi_gmem_AWVALID; i++) {
            r.tick();
            if (t->m_axi_gmem_AWREADY) t->m_axi_gmem_AWVALID = 0;
        }
        t->m_axi_gmem_WVALID = 1;
        t->m_axi_gmem_WSTRB = 0xff;
        t->m_axi_gmem_WDATA = 42;
        t->m_axi_gmem_WLAST = 1;
        for (int i = 0; i < 100; i++) {
            r.tick();
            if (t->m_axi_gmem_WREADY) break;
        }
        t->m_axi_gmem_WVALID = 0;
        CHECK(r.errors() == 1, "early WLAST: %llu errors", (unsigned long long)r.errors());
        CHECK(cf_rtl_read(r.in, 3, 0) == 42, "the beat was written");
    }
    return finish("tb_axi_rules");
}
