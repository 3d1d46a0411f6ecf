// cf_rtl_axi_wrapper.cpp - corefarm RTL simulation ABI over a Verilated
// AXI core (AMD/Vitis style; port list cores/rtl/cf_axi_ports.vh).
//
// Same ABI as cf_rtl_wrapper.cpp (docs/interfaces.md) with these meanings:
//   iface 0  the s_axi_control AXI4-Lite slave: a 64-bit word access is two
//            32-bit transactions (low register, then high), each a few cycles
//   iface 3  host memory: the model behind the core's m_axi_gmem master,
//            cf_rtl_host_bytes() bytes at bus address 1 << 32; the host's
//            accesses take no cycles (they are the CPU touching its DRAM)
//   irq      the core's `interrupt` output
// and three more symbols: cf_rtl_host_bytes, cf_rtl_mem_cycles (cycles in
// which the master port had a request pending or data moving) and
// cf_rtl_axi_errors (AXI rule violations seen on the master port: a valid
// dropped or its payload changed before ready, a burst crossing 4 KiB or
// leaving the memory, a wrong size/burst type, WLAST misplaced).
//
// The memory model answers like a DRAM controller would, with latency and
// back-pressure: a read burst's first beat comes kReadLatency cycles after
// its address, and a pseudo-random one cycle in four withholds ready or
// valid on every channel, so a master that does not hold its valids is
// caught. Deterministic: the same job takes the same cycles.

#include <cstdint>
#include <cstring>
#include <new>
#include <vector>

#include "Vcftop.h"
#include "verilated.h"

#if __has_include("cf_rtl_config.h")
#include "cf_rtl_config.h"
#endif
#ifndef CF_RTL_TOP_NAME
#define CF_RTL_TOP_NAME "unknown"
#endif

static const unsigned kResetCycles = 4;
static const uint64_t kHostBase = 1ull << 32;
static const uint64_t kHostBytes = 1ull << 20;
static const unsigned kReadLatency = 4;
// Longest a register access may wait for the slave before giving up.
static const unsigned kLiteTimeout = 1000;

namespace {

struct Held {
    bool pending = false;  // valid was high without ready last cycle
    uint64_t addr = 0, data = 0;
    unsigned len = 0, last = 0;
};

struct Instance {
    VerilatedContext *ctx;
    Vcftop *top;
    uint64_t cycles, mem_cycles, errors;
    std::vector<uint8_t> mem;
    uint32_t lfsr;
    // Read channel.
    bool rd_active;
    unsigned rd_delay, rd_beats;
    uint64_t rd_addr;
    // Write channel.
    bool wr_active, b_pending;
    unsigned wr_beats;
    uint64_t wr_addr;
    Held ar, aw, w;
    // The model's outputs are all low (set by the cycle that found the port quiet).
    bool quiet;
};

// One pseudo-random bit in four is 0: the cycles a channel stalls.
inline bool go(Instance *in) {
    in->lfsr ^= in->lfsr << 13;
    in->lfsr ^= in->lfsr >> 17;
    in->lfsr ^= in->lfsr << 5;
    return (in->lfsr & 3) != 0;
}

inline bool burst_ok(Instance *in, uint64_t addr, unsigned len, unsigned size, unsigned burst) {
    uint64_t bytes = (uint64_t)(len + 1) * 8;
    return size == 3 && burst == 1 && addr % 8 == 0 && (addr & 4095) + bytes <= 4096 &&
           addr >= kHostBase && addr - kHostBase + bytes <= in->mem.size();
}

// Checks that a valid seen without ready last cycle is still there, same payload.
inline void hold(Instance *in, Held &h, bool valid, bool ready, uint64_t addr, uint64_t data,
                 unsigned len, unsigned last) {
    if (h.pending && (!valid || h.addr != addr || h.data != data || h.len != len || h.last != last))
        in->errors++;
    h.pending = valid && !ready;
    h.addr = addr;
    h.data = data;
    h.len = len;
    h.last = last;
}

// One clock cycle: the memory model drives its outputs from its state, the
// handshakes of this edge are noted and checked, the clock ticks, the model
// takes them.
void cycle(Instance *in) {
    Vcftop *t = in->top;
    // While the master port is quiet (the core computing or idle) the model
    // holds its outputs low and the cycle is just a clock edge: the
    // simulation then runs as fast as an Avalon core's.
    if (!in->rd_active && !in->wr_active && !in->b_pending && !t->m_axi_gmem_ARVALID &&
        !t->m_axi_gmem_AWVALID && !t->m_axi_gmem_WVALID) {
        if (in->quiet) {
            in->ar.pending = in->aw.pending = in->w.pending = false;
            t->ap_clk = 0;
            t->eval();
            t->ap_clk = 1;
            t->eval();
            in->cycles++;
            return;
        }
        in->quiet = true;
    } else {
        in->quiet = false;
    }
    bool arready = !in->quiet && !in->rd_active && go(in);
    bool rvalid = in->rd_active && in->rd_delay == 0 && go(in);
    bool awready = !in->quiet && !in->wr_active && !in->b_pending && go(in);
    bool wready = in->wr_active && go(in);
    t->m_axi_gmem_ARREADY = arready;
    t->m_axi_gmem_RVALID = rvalid;
    t->m_axi_gmem_RRESP = 0;
    t->m_axi_gmem_RLAST = rvalid && in->rd_beats == 1;
    uint64_t rdata = 0;
    if (rvalid) std::memcpy(&rdata, &in->mem[in->rd_addr - kHostBase], 8);
    t->m_axi_gmem_RDATA = rdata;
    t->m_axi_gmem_AWREADY = awready;
    t->m_axi_gmem_WREADY = wready;
    t->m_axi_gmem_BVALID = in->b_pending;
    t->m_axi_gmem_BRESP = 0;
    t->eval();  // combinational outputs that depend on the inputs above

    bool ar = t->m_axi_gmem_ARVALID && arready;
    bool r = rvalid && t->m_axi_gmem_RREADY;
    bool aw = t->m_axi_gmem_AWVALID && awready;
    bool wv = t->m_axi_gmem_WVALID && wready;
    bool b = in->b_pending && t->m_axi_gmem_BREADY;
    hold(in, in->ar, t->m_axi_gmem_ARVALID, arready, t->m_axi_gmem_ARADDR, 0, t->m_axi_gmem_ARLEN, 0);
    hold(in, in->aw, t->m_axi_gmem_AWVALID, awready, t->m_axi_gmem_AWADDR, 0, t->m_axi_gmem_AWLEN, 0);
    hold(in, in->w, t->m_axi_gmem_WVALID, wready, 0, t->m_axi_gmem_WDATA, t->m_axi_gmem_WSTRB,
         t->m_axi_gmem_WLAST);
    if (t->m_axi_gmem_ARVALID || t->m_axi_gmem_AWVALID || t->m_axi_gmem_WVALID || in->rd_active ||
        in->wr_active || in->b_pending)
        in->mem_cycles++;
    uint64_t wdata = t->m_axi_gmem_WDATA;
    unsigned wstrb = t->m_axi_gmem_WSTRB, wlast = t->m_axi_gmem_WLAST;
    uint64_t araddr = t->m_axi_gmem_ARADDR, awaddr = t->m_axi_gmem_AWADDR;
    unsigned arlen = t->m_axi_gmem_ARLEN, awlen = t->m_axi_gmem_AWLEN;
    unsigned arsize = t->m_axi_gmem_ARSIZE, awsize = t->m_axi_gmem_AWSIZE;
    unsigned arburst = t->m_axi_gmem_ARBURST, awburst = t->m_axi_gmem_AWBURST;

    t->ap_clk = 0;
    t->eval();
    t->ap_clk = 1;
    t->eval();
    in->cycles++;

    if (in->rd_active && in->rd_delay > 0) in->rd_delay--;
    if (r) {
        in->rd_addr += 8;
        if (--in->rd_beats == 0) in->rd_active = false;
    }
    if (ar) {
        if (!burst_ok(in, araddr, arlen, arsize, arburst)) {
            in->errors++;
        } else {
            in->rd_active = true;
            in->rd_delay = kReadLatency;
            in->rd_beats = arlen + 1;
            in->rd_addr = araddr;
        }
    }
    if (b) in->b_pending = false;
    if (wv) {
        uint8_t *p = &in->mem[in->wr_addr - kHostBase];
        for (unsigned i = 0; i < 8; i++)
            if (wstrb >> i & 1) p[i] = (uint8_t)(wdata >> (8 * i));
        in->wr_addr += 8;
        if ((in->wr_beats == 1) != (wlast != 0)) in->errors++;
        if (--in->wr_beats == 0) {
            in->wr_active = false;
            in->b_pending = true;
        }
    }
    if (aw) {
        if (!burst_ok(in, awaddr, awlen, awsize, awburst)) {
            in->errors++;
        } else {
            in->wr_active = true;
            in->wr_beats = awlen + 1;
            in->wr_addr = awaddr;
        }
    }
}

void idle_lite(Vcftop *t) {
    t->s_axi_control_AWVALID = 0;
    t->s_axi_control_WVALID = 0;
    t->s_axi_control_BREADY = 0;
    t->s_axi_control_ARVALID = 0;
    t->s_axi_control_RREADY = 0;
}

void do_reset(Instance *in) {
    Vcftop *t = in->top;
    idle_lite(t);
    in->rd_active = in->wr_active = in->b_pending = in->quiet = false;
    in->ar = in->aw = in->w = Held();
    t->ap_rst_n = 0;
    for (unsigned i = 0; i < kResetCycles; i++) cycle(in);
    t->ap_rst_n = 1;
    cycle(in);
}

// One AXI4-Lite write of a 32-bit register (strobes `strb`).
void lite_write(Instance *in, uint32_t addr, uint32_t data, unsigned strb) {
    Vcftop *t = in->top;
    t->s_axi_control_AWADDR = addr;
    t->s_axi_control_WDATA = data;
    t->s_axi_control_WSTRB = strb;
    t->s_axi_control_AWVALID = 1;
    t->s_axi_control_WVALID = 1;
    t->s_axi_control_BREADY = 1;
    bool aw = false, w = false;
    for (unsigned n = 0; n < kLiteTimeout; n++) {
        t->eval();
        bool awh = t->s_axi_control_AWVALID && t->s_axi_control_AWREADY;
        bool wh = t->s_axi_control_WVALID && t->s_axi_control_WREADY;
        bool bh = (aw && w) && t->s_axi_control_BVALID;
        cycle(in);
        if (awh) aw = true, t->s_axi_control_AWVALID = 0;
        if (wh) w = true, t->s_axi_control_WVALID = 0;
        if (bh) break;
    }
    idle_lite(t);
}

uint32_t lite_read(Instance *in, uint32_t addr) {
    Vcftop *t = in->top;
    t->s_axi_control_ARADDR = addr;
    t->s_axi_control_ARVALID = 1;
    t->s_axi_control_RREADY = 1;
    bool ar = false;
    uint32_t value = 0;
    for (unsigned n = 0; n < kLiteTimeout; n++) {
        t->eval();
        bool arh = t->s_axi_control_ARVALID && t->s_axi_control_ARREADY;
        bool rh = ar && t->s_axi_control_RVALID;
        if (rh) value = t->s_axi_control_RDATA;
        cycle(in);
        if (arh) ar = true, t->s_axi_control_ARVALID = 0;
        if (rh) break;
    }
    idle_lite(t);
    return value;
}

}  // namespace

extern "C" {

__attribute__((visibility("default"))) uint32_t cf_rtl_abi_version(void) { return 1; }

__attribute__((visibility("default"))) const char *cf_rtl_top_name(void) {
    return CF_RTL_TOP_NAME;
}

__attribute__((visibility("default"))) uint64_t cf_rtl_host_bytes(void) { return kHostBytes; }

__attribute__((visibility("default"))) void *cf_rtl_create(void) {
    Instance *in = new (std::nothrow) Instance();
    if (!in) return nullptr;
    try {
        in->mem.assign(kHostBytes, 0);
    } catch (...) {
        delete in;
        return nullptr;
    }
    in->ctx = new (std::nothrow) VerilatedContext;
    if (!in->ctx) {
        delete in;
        return nullptr;
    }
    in->top = new (std::nothrow) Vcftop{in->ctx, "TOP"};
    if (!in->top) {
        delete in->ctx;
        delete in;
        return nullptr;
    }
    in->cycles = in->mem_cycles = in->errors = 0;
    in->lfsr = 0x9E3779B9u;
    in->top->ap_clk = 1;
    do_reset(in);
    return in;
}

__attribute__((visibility("default"))) void cf_rtl_destroy(void *p) {
    Instance *in = static_cast<Instance *>(p);
    if (!in) return;
    in->top->final();
    delete in->top;
    delete in->ctx;
    delete in;
}

__attribute__((visibility("default"))) void cf_rtl_reset(void *p) {
    if (p) do_reset(static_cast<Instance *>(p));
}

__attribute__((visibility("default"))) uint64_t cf_rtl_read(void *p, uint32_t iface,
                                                             uint32_t word) {
    Instance *in = static_cast<Instance *>(p);
    if (iface == 0) {
        uint64_t lo = lite_read(in, 8 * word);
        uint64_t hi = lite_read(in, 8 * word + 4);
        return lo | hi << 32;
    }
    if (iface == 3 && (uint64_t)word * 8 + 8 <= in->mem.size()) {
        uint64_t v;
        std::memcpy(&v, &in->mem[(uint64_t)word * 8], 8);
        return v;
    }
    return 0;
}

__attribute__((visibility("default"))) void cf_rtl_write(void *p, uint32_t iface, uint32_t word,
                                                         uint64_t data, uint8_t byteenable) {
    Instance *in = static_cast<Instance *>(p);
    if (iface == 0) {
        if (byteenable & 0x0F) lite_write(in, 8 * word, (uint32_t)data, byteenable & 0x0F);
        if (byteenable & 0xF0) lite_write(in, 8 * word + 4, (uint32_t)(data >> 32), byteenable >> 4);
        return;
    }
    if (iface == 3 && (uint64_t)word * 8 + 8 <= in->mem.size()) {
        uint8_t *m = &in->mem[(uint64_t)word * 8];
        for (unsigned i = 0; i < 8; i++)
            if (byteenable >> i & 1) m[i] = (uint8_t)(data >> (8 * i));
    }
}

__attribute__((visibility("default"))) void cf_rtl_tick(void *p, uint32_t cycles) {
    Instance *in = static_cast<Instance *>(p);
    for (uint32_t i = 0; i < cycles; i++) cycle(in);
}

__attribute__((visibility("default"))) uint64_t cf_rtl_cycles(void *p) {
    return static_cast<Instance *>(p)->cycles;
}

__attribute__((visibility("default"))) int cf_rtl_irq(void *p) {
    // Verilator renames a port named like a C++ word.
    return static_cast<Instance *>(p)->top->__SYM__interrupt ? 1 : 0;
}

__attribute__((visibility("default"))) uint64_t cf_rtl_mem_cycles(void *p) {
    return static_cast<Instance *>(p)->mem_cycles;
}

__attribute__((visibility("default"))) uint64_t cf_rtl_axi_errors(void *p) {
    return static_cast<Instance *>(p)->errors;
}

}  // extern "C"
