/* OSU-style latency of MPI collectives, written for corefarm's benchmark
 * suite so Open MPI is measured on the same machine, in the same run, as
 * corefarm's node-resident collectives (bench/suite.py `collectives`).
 *
 *   mpirun -n N osu_coll OP MIN_BYTES MAX_BYTES ITERS WARMUP
 *
 * OP: bcast, reduce, allreduce, allgather, gather, scatter, barrier.
 * Sizes double from MIN to MAX (bytes per rank, as corefarm's buffers);
 * reductions are MPI_SUM over int32. For each size: WARMUP untimed
 * iterations, then ITERS timed ones, each ending in a barrier-free
 * completion as OSU does; the latency is the mean over iterations of the
 * slowest rank's time (MPI_MAX over ranks), in microseconds. Rank 0 prints
 * one JSON object per line: {"op":..,"ranks":..,"bytes":..,"latency_us":..}. */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int run(const char *op, void *s, void *r, int bytes, int n, MPI_Comm c) {
    int count = bytes / 4 > 0 ? bytes / 4 : 1;
    if (!strcmp(op, "bcast")) return MPI_Bcast(s, bytes, MPI_BYTE, 0, c);
    if (!strcmp(op, "reduce")) return MPI_Reduce(s, r, count, MPI_INT, MPI_SUM, 0, c);
    if (!strcmp(op, "allreduce")) return MPI_Allreduce(s, r, count, MPI_INT, MPI_SUM, c);
    if (!strcmp(op, "allgather")) return MPI_Allgather(s, bytes, MPI_BYTE, r, bytes, MPI_BYTE, c);
    if (!strcmp(op, "gather")) return MPI_Gather(s, bytes, MPI_BYTE, r, bytes, MPI_BYTE, 0, c);
    if (!strcmp(op, "scatter")) return MPI_Scatter(r, bytes, MPI_BYTE, s, bytes, MPI_BYTE, 0, c);
    if (!strcmp(op, "barrier")) return MPI_Barrier(c);
    (void)n;
    return -1;
}

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    int rank, n;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &n);
    if (argc != 6) {
        if (rank == 0) fprintf(stderr, "usage: osu_coll OP MIN_BYTES MAX_BYTES ITERS WARMUP\n");
        MPI_Finalize();
        return 2;
    }
    const char *op = argv[1];
    long min = atol(argv[2]), max = atol(argv[3]);
    int iters = atoi(argv[4]), warmup = atoi(argv[5]);
    if (min < 1 || max < min || iters < 1 || warmup < 0) {
        if (rank == 0) fprintf(stderr, "osu_coll: bad sizes or iteration counts\n");
        MPI_Finalize();
        return 2;
    }
    char *s = malloc(max), *r = malloc((size_t)max * n);
    memset(s, rank + 1, max);
    memset(r, 0, (size_t)max * n);
    for (long bytes = min; bytes <= max; bytes *= 2) {
        double total = 0;
        for (int i = 0; i < warmup + iters; i++) {
            MPI_Barrier(MPI_COMM_WORLD);
            double t0 = MPI_Wtime();
            if (run(op, s, r, (int)bytes, n, MPI_COMM_WORLD) != MPI_SUCCESS) {
                if (rank == 0) fprintf(stderr, "osu_coll: unknown or failed op %s\n", op);
                MPI_Abort(MPI_COMM_WORLD, 2);
            }
            double dt = MPI_Wtime() - t0, slowest;
            MPI_Reduce(&dt, &slowest, 1, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD);
            if (i >= warmup) total += slowest;
        }
        if (rank == 0)
            printf("{\"op\":\"%s\",\"ranks\":%d,\"bytes\":%ld,\"latency_us\":%.3f}\n", op, n, bytes,
                   total / iters * 1e6);
        fflush(stdout);
        if (!strcmp(op, "barrier")) break;
    }
    free(s);
    free(r);
    MPI_Finalize();
    return 0;
}
