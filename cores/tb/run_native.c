/* Runs a native soft core (docs/interfaces.md: `void entry(const uint8_t *in,
 * uint8_t *out)` in a shared object) on a file of inputs, one after another,
 * and writes the outputs: a harness for checking an artifact outside a node,
 * e.g. a cross-compiled one under qemu-user.
 *
 *   run_native CORE.so ENTRY INPUT_SIZE OUTPUT_SIZE INPUTS.bin OUTPUTS.bin
 *
 * Buffers are 16-byte aligned, as a node gives them (crates/cores native.rs). */
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef void (*entry_fn)(const uint8_t *, uint8_t *);

static long size_arg(const char *s, const char *what) {
    char *end;
    long v = strtol(s, &end, 0);
    if (*s == '\0' || *end != '\0' || v <= 0) {
        fprintf(stderr, "run_native: bad %s %s\n", what, s);
        exit(2);
    }
    return v;
}

int main(int argc, char **argv) {
    if (argc != 7) {
        fprintf(stderr, "usage: %s CORE.so ENTRY INPUT_SIZE OUTPUT_SIZE INPUTS.bin OUTPUTS.bin\n", argv[0]);
        return 2;
    }
    long in_size = size_arg(argv[3], "input size"), out_size = size_arg(argv[4], "output size");
    void *lib = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
        fprintf(stderr, "run_native: %s\n", dlerror());
        return 1;
    }
    entry_fn entry = (entry_fn)dlsym(lib, argv[2]);
    if (!entry) {
        fprintf(stderr, "run_native: no symbol %s: %s\n", argv[2], dlerror());
        return 1;
    }
    FILE *in = fopen(argv[5], "rb"), *out = fopen(argv[6], "wb");
    if (!in || !out) {
        perror("run_native");
        return 1;
    }
    uint8_t *ibuf = aligned_alloc(16, (in_size + 15) / 16 * 16);
    uint8_t *obuf = aligned_alloc(16, (out_size + 15) / 16 * 16);
    long n = 0;
    size_t got;
    while ((got = fread(ibuf, 1, in_size, in)) == (size_t)in_size) {
        memset(obuf, 0, out_size);
        entry(ibuf, obuf);
        if (fwrite(obuf, 1, out_size, out) != (size_t)out_size) {
            perror("run_native: writing");
            return 1;
        }
        n++;
    }
    if (got != 0) {
        fprintf(stderr, "run_native: trailing %zu bytes (not a whole input)\n", got);
        return 1;
    }
    fclose(out);
    printf("run_native: %ld inputs\n", n);
    return 0;
}
