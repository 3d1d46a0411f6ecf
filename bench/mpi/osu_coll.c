/* OSU-style latency of MPI collectives, written for corefarm's benchmark
 * suite so Open MPI is measured on the same machine, in the same run, as
 * corefarm's collectives (bench/suite.py `collectives`, bench/mpi/README.md).
 *
 *   mpirun -n N osu_coll OP ITERS WARMUP BYTES [BYTES ...]
 *
 * OP: bcast, reduce, allreduce, allgather, gather, scatter, barrier.
 * BYTES: per rank, as corefarm's buffers (a positive multiple of 4);
 * reductions are MPI_SUM over int32, as `corefarm bench collectives` runs
 * them. For each size: WARMUP untimed calls, then ITERS timed ones, each
 * after a barrier (as OSU does); a call's time is the slowest rank's
 * (MPI_MAX over ranks), and its span runs from the first rank in to the
 * last rank out. The result of the first reduce/allreduce is checked
 * against the expected sum. Rank 0 prints one JSON object per size:
 * {"op","ranks","bytes","iters","median_us","p99_us","mean_us","min_us",
 *  "span_median_us","span_p99_us"}. */
#include <limits.h>
#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static int run(const char *op, void *s, void *r, int bytes, MPI_Comm c) {
    int count = bytes / 4;
    if (!strcmp(op, "bcast")) return MPI_Bcast(s, bytes, MPI_BYTE, 0, c);
    if (!strcmp(op, "reduce")) return MPI_Reduce(s, r, count, MPI_INT32_T, MPI_SUM, 0, c);
    if (!strcmp(op, "allreduce")) return MPI_Allreduce(s, r, count, MPI_INT32_T, MPI_SUM, c);
    if (!strcmp(op, "allgather")) return MPI_Allgather(s, bytes, MPI_BYTE, r, bytes, MPI_BYTE, c);
    if (!strcmp(op, "gather")) return MPI_Gather(s, bytes, MPI_BYTE, r, bytes, MPI_BYTE, 0, c);
    if (!strcmp(op, "scatter")) return MPI_Scatter(r, bytes, MPI_BYTE, s, bytes, MPI_BYTE, 0, c);
    if (!strcmp(op, "barrier")) return MPI_Barrier(c);
    return -1;
}

/* Seconds on the host's monotonic clock, which every rank on this machine
 * shares: the span of a call (first rank in to last rank out) is then a
 * difference of two readings taken by different ranks. */
static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static int cmp(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double quantile(const double *sorted, int n, double q) {
    int i = (int)((n - 1) * q + 0.5);
    return sorted[i < n ? i : n - 1];
}

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    int rank, n;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &n);
    if (argc < 5) {
        if (rank == 0) fprintf(stderr, "usage: osu_coll OP ITERS WARMUP BYTES [BYTES ...]\n");
        MPI_Finalize();
        return 2;
    }
    const char *op = argv[1];
    int iters = atoi(argv[2]), warmup = atoi(argv[3]);
    long max = 0;
    for (int a = 4; a < argc; a++) {
        long b = atol(argv[a]);
        if (b < 4 || b % 4 || b > INT_MAX / n) {
            if (rank == 0) fprintf(stderr, "osu_coll: %s is not a positive multiple of 4 below 2^31/ranks\n", argv[a]);
            MPI_Finalize();
            return 2;
        }
        if (b > max) max = b;
    }
    if (iters < 1 || warmup < 0) {
        if (rank == 0) fprintf(stderr, "osu_coll: ITERS must be at least 1, WARMUP at least 0\n");
        MPI_Finalize();
        return 2;
    }
    char *s = malloc(max), *r = malloc((size_t)max * n);
    double *t = malloc(sizeof(double) * iters), *span = malloc(sizeof(double) * iters);
    if (!s || !r || !t || !span) MPI_Abort(MPI_COMM_WORLD, 3);
    int checked = 0;
    for (int a = 4; a < argc; a++) {
        int bytes = (int)atol(argv[a]);
        memset(s, rank + 1, max);
        memset(r, 0, (size_t)max * n);
        for (int i = 0; i < warmup + iters; i++) {
            MPI_Barrier(MPI_COMM_WORLD);
            double t0 = MPI_Wtime(), in = now_s();
            if (run(op, s, r, bytes, MPI_COMM_WORLD) != MPI_SUCCESS) {
                if (rank == 0) fprintf(stderr, "osu_coll: unknown or failed op %s\n", op);
                MPI_Abort(MPI_COMM_WORLD, 2);
            }
            double dt = MPI_Wtime() - t0, out = now_s(), slowest, first_in, last_out;
            MPI_Reduce(&dt, &slowest, 1, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD);
            MPI_Reduce(&in, &first_in, 1, MPI_DOUBLE, MPI_MIN, 0, MPI_COMM_WORLD);
            MPI_Reduce(&out, &last_out, 1, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD);
            if (i >= warmup) {
                t[i - warmup] = slowest;
                span[i - warmup] = last_out - first_in;
            }
            /* Every int32 of rank k is (k+1)·0x01010101; the sum wraps as the cores' does. */
            if (!checked && rank == 0 && (!strcmp(op, "reduce") || !strcmp(op, "allreduce"))) {
                uint32_t want = 0, got;
                for (int k = 0; k < n; k++) want += (uint32_t)(k + 1) * 0x01010101u;
                memcpy(&got, r, 4);
                if (got != want) {
                    fprintf(stderr, "osu_coll: %s gave %u, expected %u\n", op, got, want);
                    MPI_Abort(MPI_COMM_WORLD, 4);
                }
                checked = 1;
            }
        }
        if (rank == 0) {
            double sum = 0;
            for (int i = 0; i < iters; i++) sum += t[i];
            qsort(t, iters, sizeof(double), cmp);
            qsort(span, iters, sizeof(double), cmp);
            printf("{\"op\":\"%s\",\"ranks\":%d,\"bytes\":%d,\"iters\":%d,\"median_us\":%.3f,"
                   "\"p99_us\":%.3f,\"mean_us\":%.3f,\"min_us\":%.3f,\"span_median_us\":%.3f,"
                   "\"span_p99_us\":%.3f}\n",
                   op, n, !strcmp(op, "barrier") ? 0 : bytes, iters, quantile(t, iters, 0.5) * 1e6,
                   quantile(t, iters, 0.99) * 1e6, sum / iters * 1e6, t[0] * 1e6,
                   quantile(span, iters, 0.5) * 1e6, quantile(span, iters, 0.99) * 1e6);
            fflush(stdout);
        }
        if (!strcmp(op, "barrier")) break;
    }
    free(s);
    free(r);
    free(t);
    MPI_Finalize();
    return 0;
}
