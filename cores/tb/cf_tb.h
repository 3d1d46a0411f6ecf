// cf_tb.h - helpers for corefarm core testbenches (header-only, C++17).
//
// Testbenches load the shared objects the toolchain builds and drive them
// only through their public ABIs (docs/interfaces.md), so they test exactly
// what a node loads:
//   RTL:    cf_rtl_* functions of a Verilator-built core
//   native: void <entry>(const uint8_t *in, uint8_t *out)
// Every failed CHECK prints its location and makes the program exit 1; a
// passing testbench prints "PASS <name>" last and exits 0.
#ifndef CF_TB_H
#define CF_TB_H

#include <dlfcn.h>

#include <chrono>
#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

namespace cftb {

inline int &failures() {
    static int n = 0;
    return n;
}

#define CHECK(cond, ...)                                                        \
    do {                                                                        \
        if (!(cond)) {                                                          \
            std::fprintf(stderr, "%s:%d: CHECK(%s) failed: ", __FILE__, __LINE__, \
                         #cond);                                                \
            std::fprintf(stderr, __VA_ARGS__);                                  \
            std::fprintf(stderr, "\n");                                         \
            ::cftb::failures()++;                                               \
            if (::cftb::failures() > 20) std::exit(1);                          \
        }                                                                       \
    } while (0)

[[noreturn]] inline void die(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    std::vfprintf(stderr, fmt, ap);
    va_end(ap);
    std::fprintf(stderr, "\n");
    std::exit(2);
}

inline int finish(const char *name) {
    if (failures()) {
        std::printf("FAIL %s (%d checks failed)\n", name, failures());
        return 1;
    }
    std::printf("PASS %s\n", name);
    return 0;
}

inline void *open_lib(const char *path) {
    // RTLD_LOCAL: several cores may be loaded side by side.
    void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!h) die("dlopen %s: %s", path, dlerror());
    return h;
}

template <typename F>
F sym(void *h, const char *name) {
    void *p = dlsym(h, name);
    if (!p) die("missing symbol %s: %s", name, dlerror());
    return reinterpret_cast<F>(p);
}

// The RTL simulation ABI, resolved from one shared object.
struct RtlLib {
    uint32_t (*abi_version)(void);
    const char *(*top_name)(void);
    void *(*create)(void);
    void (*destroy)(void *);
    void (*reset)(void *);
    uint64_t (*read)(void *, uint32_t, uint32_t);
    void (*write)(void *, uint32_t, uint32_t, uint64_t, uint8_t);
    void (*tick)(void *, uint32_t);
    uint64_t (*cycles)(void *);
    int (*irq)(void *);

    explicit RtlLib(const char *path) {
        void *h = open_lib(path);
        abi_version = sym<decltype(abi_version)>(h, "cf_rtl_abi_version");
        top_name = sym<decltype(top_name)>(h, "cf_rtl_top_name");
        create = sym<decltype(create)>(h, "cf_rtl_create");
        destroy = sym<decltype(destroy)>(h, "cf_rtl_destroy");
        reset = sym<decltype(reset)>(h, "cf_rtl_reset");
        read = sym<decltype(read)>(h, "cf_rtl_read");
        write = sym<decltype(write)>(h, "cf_rtl_write");
        tick = sym<decltype(tick)>(h, "cf_rtl_tick");
        cycles = sym<decltype(cycles)>(h, "cf_rtl_cycles");
        irq = sym<decltype(irq)>(h, "cf_rtl_irq");
    }
};

enum Iface : uint32_t { CSR = 0, IN = 1, OUT = 2 };
enum Reg : uint32_t { BUSY = 0, START = 1, IE = 2, DONE = 3 };

// One RTL core instance plus the host-side job cycle of seed 000 table 3.1.
struct Rtl {
    const RtlLib &L;
    void *inst;

    explicit Rtl(const RtlLib &lib) : L(lib), inst(lib.create()) {
        if (!inst) die("cf_rtl_create returned NULL");
    }
    ~Rtl() { L.destroy(inst); }
    Rtl(const Rtl &) = delete;
    Rtl &operator=(const Rtl &) = delete;

    uint64_t csr(Reg r) { return L.read(inst, CSR, r); }
    void set(Reg r, uint64_t v) { L.write(inst, CSR, r, v, 0xff); }
    bool busy() { return csr(BUSY) & 1; }
    bool done() { return csr(DONE) & 1; }
    void start() { set(START, 1); }
    void clear_done() { set(DONE, 1); }

    // Writes `n` bytes at byte 0 of memory `iface`; a trailing partial word
    // is written with a partial byteenable.
    void store(Iface iface, const uint8_t *bytes, size_t n) {
        for (size_t off = 0; off < n; off += 8) {
            uint64_t w = 0;
            size_t len = n - off < 8 ? n - off : 8;
            std::memcpy(&w, bytes + off, len);  // little-endian host
            L.write(inst, iface, uint32_t(off / 8), w, uint8_t((1u << len) - 1));
        }
    }
    void load(Iface iface, uint8_t *bytes, size_t n) {
        for (size_t off = 0; off < n; off += 8) {
            uint64_t w = L.read(inst, iface, uint32_t(off / 8));
            size_t len = n - off < 8 ? n - off : 8;
            std::memcpy(bytes + off, &w, len);
        }
    }

    // Polls done every `poll` cycles; returns the cycles from start to the
    // first read that saw done, or 0 if `limit` cycles pass first.
    uint64_t wait_done(uint64_t limit, uint32_t poll = 1) {
        uint64_t t0 = L.cycles(inst);
        while (L.cycles(inst) - t0 < limit) {
            if (done()) return L.cycles(inst) - t0;
            if (poll > 1) L.tick(inst, poll - 1);
        }
        return 0;
    }

    // Full job: input, start, wait, output, clear done. Returns cycles.
    uint64_t run(const std::vector<uint8_t> &in, std::vector<uint8_t> &out,
                 uint64_t limit, uint32_t poll = 64) {
        store(IN, in.data(), in.size());
        start();
        uint64_t c = wait_done(limit, poll);
        if (c) {
            load(OUT, out.data(), out.size());
            clear_done();
        }
        return c;
    }
};

inline std::vector<uint8_t> random_bytes(std::mt19937_64 &rng, size_t n) {
    std::vector<uint8_t> v(n);
    for (auto &b : v) b = uint8_t(rng());
    return v;
}

inline double now_seconds() {
    return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch())
        .count();
}

// First differing byte of two equal-sized buffers, or -1.
inline long first_diff(const std::vector<uint8_t> &a, const std::vector<uint8_t> &b) {
    for (size_t i = 0; i < a.size() && i < b.size(); i++)
        if (a[i] != b[i]) return long(i);
    return a.size() == b.size() ? -1 : long(a.size() < b.size() ? a.size() : b.size());
}

// Checks shared by every Verilog core that completes jobs: reset state,
// register behaviour, byteenable writes, a correct job with interrupts on
// and off, start-while-busy ignored, done sticky until written 1, reset
// while busy. `reference` computes the expected output on the host.
template <typename Ref>
void check_csr_and_job(const RtlLib &L, const char *expect_top, size_t in_size,
                       size_t out_size, uint64_t job_cycles_max, Ref reference,
                       std::mt19937_64 &rng) {
    CHECK(L.abi_version() == 1, "abi version %u", L.abi_version());
    CHECK(std::strcmp(L.top_name(), expect_top) == 0, "top name %s", L.top_name());
    Rtl c(L);

    // Reset state.
    CHECK(!c.busy(), "busy after reset");
    CHECK(!c.done(), "done after reset");
    CHECK(c.csr(IE) == 0, "interrupt enable after reset");
    CHECK(L.irq(c.inst) == 0, "irq after reset");
    c.set(IE, 1);
    CHECK(c.csr(IE) == 1, "interrupt enable readback");

    // Memory round trip, including a partial-byteenable write.
    std::vector<uint8_t> in = random_bytes(rng, in_size), back(in_size);
    c.store(IN, in.data(), in.size());
    c.load(IN, back.data(), back.size());
    CHECK(first_diff(in, back) < 0, "input readback differs at byte %ld", first_diff(in, back));
    uint64_t w0 = L.read(c.inst, IN, 0);
    L.write(c.inst, IN, 0, ~w0, 0x0f);
    uint64_t w1 = L.read(c.inst, IN, 0);
    CHECK(w1 == ((w0 & 0xffffffff00000000ull) | (~w0 & 0xffffffffull)),
          "byteenable 0x0f write: %016llx -> %016llx", (unsigned long long)w0,
          (unsigned long long)w1);
    L.write(c.inst, IN, 0, w0, 0xff);
    CHECK(L.read(c.inst, IN, 0) == w0, "full write restore");
    // Out-of-range words read as 0 and writes there do not alias.
    L.write(c.inst, IN, uint32_t(in_size / 8 + 7), ~0ull, 0xff);
    CHECK(L.read(c.inst, IN, uint32_t(in_size / 8 + 7)) == 0, "out-of-range read");
    c.load(IN, back.data(), back.size());
    CHECK(first_diff(in, back) < 0, "out-of-range write aliased at byte %ld",
          first_diff(in, back));

    // Job 1 with interrupts enabled; polled every cycle to time it exactly.
    std::vector<uint8_t> expect(out_size), out(out_size);
    reference(in.data(), expect.data());
    uint64_t s1 = L.cycles(c.inst);
    c.start();
    CHECK(c.busy(), "busy right after start");
    CHECK(!c.done(), "done right after start");
    CHECK(L.irq(c.inst) == 0, "irq while busy");
    uint64_t t1 = c.wait_done(job_cycles_max) ? L.cycles(c.inst) - s1 : 0;
    CHECK(t1 > 0, "job did not finish within %llu cycles", (unsigned long long)job_cycles_max);
    CHECK(!c.busy(), "busy after done");
    CHECK(L.irq(c.inst) == 1, "irq with done and interrupt enable");
    c.load(OUT, out.data(), out.size());
    CHECK(first_diff(out, expect) < 0, "job 1 output differs at byte %ld", first_diff(out, expect));

    // done is sticky: survives time and a write of 0; cleared by writing 1.
    L.tick(c.inst, 100);
    CHECK(c.done(), "done not sticky");
    c.set(DONE, 0);
    CHECK(c.done(), "writing 0 cleared done");
    c.clear_done();
    CHECK(!c.done(), "writing 1 did not clear done");
    CHECK(L.irq(c.inst) == 0, "irq after clearing done");

    // Job 2: same input, but a second start is issued while busy. It must be
    // ignored: same duration, same result, no second job afterwards.
    uint64_t s2 = L.cycles(c.inst);
    c.start();
    L.tick(c.inst, 3);
    CHECK(c.busy(), "busy during job 2");
    c.start();
    uint64_t t2 = c.wait_done(job_cycles_max) ? L.cycles(c.inst) - s2 : 0;
    CHECK(t2 == t1, "start while busy changed the job length: %llu vs %llu cycles",
          (unsigned long long)t2, (unsigned long long)t1);
    CHECK(!c.busy(), "a start while busy was queued");
    c.load(OUT, out.data(), out.size());
    CHECK(first_diff(out, expect) < 0, "job 2 output differs at byte %ld", first_diff(out, expect));
    c.clear_done();
    L.tick(c.inst, uint32_t(t1 + 10));
    CHECK(!c.busy() && !c.done(), "a second job ran after start-while-busy");

    // Job 3: new data, interrupts disabled: done rises, irq does not.
    c.set(IE, 0);
    in = random_bytes(rng, in_size);
    reference(in.data(), expect.data());
    uint64_t t3 = c.run(in, out, job_cycles_max, 1);
    CHECK(t3 > 0, "job 3 did not finish");
    CHECK(L.irq(c.inst) == 0, "irq with interrupts disabled");
    CHECK(first_diff(out, expect) < 0, "job 3 output differs at byte %ld", first_diff(out, expect));

    // Reset while busy returns to idle.
    c.start();
    L.tick(c.inst, 2);
    CHECK(c.busy(), "busy before reset");
    L.reset(c.inst);
    CHECK(!c.busy() && !c.done(), "reset did not clear busy/done");

    // The cycle counter counts every cycle: bus transactions and ticks.
    uint64_t before = L.cycles(c.inst);
    L.tick(c.inst, 1000);
    c.csr(BUSY);
    c.set(IE, 0);
    CHECK(L.cycles(c.inst) == before + 1002, "cycle count %llu, expected %llu",
          (unsigned long long)L.cycles(c.inst), (unsigned long long)(before + 1002));
}

}  // namespace cftb

#endif  // CF_TB_H
