/*
 * corefarm/hls.h - compile Intel HLS hardware-core sources for the CPU.
 *
 * The seed's hardware-core signature (seed 000 section 3.4.1.2)
 *
 *     hls_avalon_agent_component
 *     component void hardware_core(
 *         hls_avalon_agent_memory_argument(INPUT_SIZE) uint8_t *in,
 *         hls_avalon_agent_memory_argument(OUTPUT_SIZE) uint8_t *out);
 *
 * compiles unchanged with gcc/g++ when this header is included instead of
 * <HLS/hls.h>. The result, built with `-shared -fPIC`, is a corefarm native
 * soft core: a shared object exporting with C linkage
 *
 *     void <entry>(const uint8_t *in, uint8_t *out);
 *
 * (an `int *` or non-const signature is ABI-identical on every supported
 * target, so the seed's `int *in, int *out` matrix multiplier works as is).
 *
 * The HLS-only attributes carry synthesis hints that have no meaning on a
 * CPU, so they expand to nothing. When the real Intel HLS compiler is used
 * (it defines __INTELFPGA_COMPILER__), its own header is included instead.
 */
#ifndef COREFARM_HLS_H
#define COREFARM_HLS_H

#if defined(__INTELFPGA_COMPILER__)
#include "HLS/hls.h"
#else

#include <stdint.h>
#include <stddef.h>

#if defined(_WIN32)
#define CF_HLS_EXPORT __declspec(dllexport)
#else
/* Default visibility keeps the entry exported even under -fvisibility=hidden. */
#define CF_HLS_EXPORT __attribute__((visibility("default")))
#endif

/* `component` marks the entry point: C linkage so the loader can find it by
 * its plain name. `component void f(...)` becomes `extern "C" ... void f(...)`. */
#ifdef __cplusplus
#define component extern "C" CF_HLS_EXPORT
#else
#define component CF_HLS_EXPORT
#endif

/* Interface and synthesis attributes: no CPU meaning. */
#define hls_avalon_agent_component
#define hls_avalon_slave_component
#define hls_always_run_component
#define hls_stall_free_return
#define hls_component_ii(n)
#define hls_max_concurrency(n)
#define hls_scheduler_target_fmax_mhz(n)
#define hls_avalon_agent_memory_argument(n)
#define hls_avalon_slave_memory_argument(n)
#define hls_avalon_agent_register_argument
#define hls_avalon_slave_register_argument
#define hls_conduit_argument
#define hls_stable_argument
#define hls_register_argument
#define hls_readwrite_mode(m)
#define hls_bankwidth(n)
#define hls_numbanks(n)
#define hls_bankbits(...)
#define hls_singlepump
#define hls_doublepump
#define hls_register
#define hls_memory
#define hls_memory_impl(x)
#define hls_simple_dual_port_memory
#define hls_max_replicates(n)
#define hls_private_copies(n)
#define hls_init_on_powerup
#define hls_init_on_reset

#endif /* __INTELFPGA_COMPILER__ */
#endif /* COREFARM_HLS_H */
