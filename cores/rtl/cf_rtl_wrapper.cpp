// cf_rtl_wrapper.cpp - corefarm RTL simulation ABI over a Verilated top module.
//
// corefarm's toolchain (crates/cores/src/toolchain.rs) Verilates a core with
// `--prefix Vcftop`, compiles this file next to it and links everything,
// including the Verilator runtime, into one shared object exporting the C ABI
// below (docs/interfaces.md, "RTL simulation ABI"). The toolchain also
// generates cf_rtl_config.h, which defines CF_RTL_TOP_NAME.
//
// Fixed port list of every corefarm RTL core (the top module):
//
//   input         clock
//   input         resetn                     active-low synchronous reset
//   for X in cra (control/status registers), in (input memory), out (output memory):
//   input  [31:0] avs_X_address              64-bit word address
//   input         avs_X_read
//   input         avs_X_write
//   input  [63:0] avs_X_writedata
//   input   [7:0] avs_X_byteenable           bit i enables writedata[8i+7:8i]
//   output [63:0] avs_X_readdata             valid the cycle after avs_X_read
//   output        irq                        done & interrupt_enable
//
// Avalon-MM agents with fixed read latency 1 and no waitrequest. CSR words:
// 0 busy (R), 1 start (W 1), 2 interrupt enable (R/W), 3 done (R, W1C),
// i.e. byte offsets 0x00/0x08/0x10/0x18 of seed 000 table 3.1.
//
// Clocking: between calls the clock rests high, just after a rising edge, so
// inputs set by a call are sampled at the next rising edge and registered
// outputs are visible right after it. One call of cf_rtl_read/cf_rtl_write is
// one bus cycle. An instance is not thread-safe; distinct instances are
// independent (each has its own VerilatedContext) and may run on different
// threads.

#include <cstdint>
#include <new>

#include "Vcftop.h"
#include "verilated.h"

#if __has_include("cf_rtl_config.h")
#include "cf_rtl_config.h"
#endif
#ifndef CF_RTL_TOP_NAME
#define CF_RTL_TOP_NAME "unknown"
#endif

// Reset is held for a few cycles so multi-stage reset logic settles.
static const unsigned kResetCycles = 4;

namespace {

struct Instance {
    VerilatedContext *ctx;
    Vcftop *top;
    uint64_t cycles;
};

inline void clock_cycle(Vcftop *top) {
    top->clock = 0;
    top->eval();
    top->clock = 1;
    top->eval();
}

// Deasserts every bus request so an idle cycle is really idle.
inline void idle_bus(Vcftop *top) {
    top->avs_cra_read = 0;
    top->avs_cra_write = 0;
    top->avs_in_read = 0;
    top->avs_in_write = 0;
    top->avs_out_read = 0;
    top->avs_out_write = 0;
}

void do_reset(Instance *inst) {
    Vcftop *top = inst->top;
    idle_bus(top);
    top->resetn = 0;
    for (unsigned i = 0; i < kResetCycles; i++) clock_cycle(top);
    top->resetn = 1;
    clock_cycle(top);
    inst->cycles += kResetCycles + 1;
}

}  // namespace

// Runs one bus cycle on agent X with the request signals set by SETUP.
#define CF_BUS_CYCLE(X, SETUP)        \
    do {                              \
        SETUP;                        \
        clock_cycle(top);             \
        top->avs_##X##_read = 0;      \
        top->avs_##X##_write = 0;     \
    } while (0)

extern "C" {

__attribute__((visibility("default"))) uint32_t cf_rtl_abi_version(void) { return 1; }

__attribute__((visibility("default"))) const char *cf_rtl_top_name(void) {
    return CF_RTL_TOP_NAME;
}

__attribute__((visibility("default"))) void *cf_rtl_create(void) {
    Instance *inst = new (std::nothrow) Instance();
    if (!inst) return nullptr;
    inst->ctx = new (std::nothrow) VerilatedContext;
    if (!inst->ctx) {
        delete inst;
        return nullptr;
    }
    inst->top = new (std::nothrow) Vcftop{inst->ctx, "TOP"};
    if (!inst->top) {
        delete inst->ctx;
        delete inst;
        return nullptr;
    }
    inst->cycles = 0;
    inst->top->clock = 1;
    do_reset(inst);
    return inst;
}

__attribute__((visibility("default"))) void cf_rtl_destroy(void *p) {
    Instance *inst = static_cast<Instance *>(p);
    if (!inst) return;
    inst->top->final();
    delete inst->top;
    delete inst->ctx;
    delete inst;
}

__attribute__((visibility("default"))) void cf_rtl_reset(void *p) {
    if (p) do_reset(static_cast<Instance *>(p));
}

__attribute__((visibility("default"))) uint64_t cf_rtl_read(void *p, uint32_t iface,
                                                             uint32_t word) {
    Instance *inst = static_cast<Instance *>(p);
    Vcftop *top = inst->top;
    uint64_t value;
    switch (iface) {
        case 0:
            CF_BUS_CYCLE(cra, (top->avs_cra_address = word, top->avs_cra_read = 1));
            value = top->avs_cra_readdata;
            break;
        case 1:
            CF_BUS_CYCLE(in, (top->avs_in_address = word, top->avs_in_read = 1));
            value = top->avs_in_readdata;
            break;
        case 2:
            CF_BUS_CYCLE(out, (top->avs_out_address = word, top->avs_out_read = 1));
            value = top->avs_out_readdata;
            break;
        default:
            return 0;
    }
    inst->cycles++;
    return value;
}

__attribute__((visibility("default"))) void cf_rtl_write(void *p, uint32_t iface,
                                                         uint32_t word, uint64_t data,
                                                         uint8_t byteenable) {
    Instance *inst = static_cast<Instance *>(p);
    Vcftop *top = inst->top;
    switch (iface) {
        case 0:
            CF_BUS_CYCLE(cra, (top->avs_cra_address = word, top->avs_cra_writedata = data,
                               top->avs_cra_byteenable = byteenable, top->avs_cra_write = 1));
            break;
        case 1:
            CF_BUS_CYCLE(in, (top->avs_in_address = word, top->avs_in_writedata = data,
                              top->avs_in_byteenable = byteenable, top->avs_in_write = 1));
            break;
        case 2:
            CF_BUS_CYCLE(out, (top->avs_out_address = word, top->avs_out_writedata = data,
                               top->avs_out_byteenable = byteenable, top->avs_out_write = 1));
            break;
        default:
            return;
    }
    inst->cycles++;
}

__attribute__((visibility("default"))) void cf_rtl_tick(void *p, uint32_t cycles) {
    Instance *inst = static_cast<Instance *>(p);
    Vcftop *top = inst->top;
    for (uint32_t i = 0; i < cycles; i++) clock_cycle(top);
    inst->cycles += cycles;
}

__attribute__((visibility("default"))) uint64_t cf_rtl_cycles(void *p) {
    return static_cast<Instance *>(p)->cycles;
}

__attribute__((visibility("default"))) int cf_rtl_irq(void *p) {
    return static_cast<Instance *>(p)->top->irq ? 1 : 0;
}

}  // extern "C"
