// faulty - a deliberately broken HLS core for the isolation tests
// (crates/cores/tests/isolation.rs, crates/cli/tests/isolation.rs).
// 64-byte input, 64-byte output: out[i] = in[i] ^ 0x5A, unless the first
// input byte selects a fault:
//   0xF1  writes 64 KiB from `out` (as a core in an image built with
//         wrong sizes would): past the output memory
//   0xF2  writes through the pointer held in in[1..9] (zero: a null write)
//   0xF3  never returns
//   0xF4  calls abort()
//   0xF5  writes its input (read-only for a core)
//   0xF6  no fault, but takes 200 ms (a job an event loop has to wait for)
//   0xFF  like 0xF2
#include <cstdlib>
#include <cstring>
#include <unistd.h>

#include "corefarm/hls.h"

hls_avalon_agent_component
component void faulty(hls_avalon_agent_memory_argument(64) uint8_t *in,
                      hls_avalon_agent_memory_argument(64) uint8_t *out)
{
    switch (in[0]) {
    case 0xF1:
        memset(out, 0xAB, 1 << 16);
        return;
    case 0xF2:
    case 0xFF: {
        // Read from the input, so the compiler cannot see a null pointer.
        uint8_t *p;
        memcpy(&p, in + 1, sizeof p);
        *p = 1;
        return;
    }
    case 0xF3:
        for (volatile unsigned spin = 0;; spin++) {
        }
    case 0xF4:
        abort();
    case 0xF5:
        in[1] = 1;
        return;
    case 0xF6:
        usleep(200000);
        [[fallthrough]];
    default:
        for (int i = 0; i < 64; i++)
            out[i] = in[i] ^ 0x5A;
    }
}
