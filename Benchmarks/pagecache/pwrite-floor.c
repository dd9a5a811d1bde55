/* The kernel's floor under the journal's writes (issue 27): the CPU one process spends putting B bytes per round
 * trip into the page cache the way fluxd's journal does: segments of 16 MiB allocated ahead (fallocate), one
 * pwrite per loop iteration at increasing offsets, nothing else. No sync (what `none` does; `batch` adds the sync
 * thread's fdatasync every 100 ms).
 *
 *   gcc -O2 -o pwrite-floor Benchmarks/pagecache/pwrite-floor.c
 *   ./pwrite-floor DIR [BYTES_PER_ROUND_TRIP=378] [ROUND_TRIPS_PER_WRITE=64] [ROUND_TRIPS=2000000] [mmap]
 *
 * With `mmap` the segment is mapped (MAP_SHARED) and each write is a memcpy into the mapping instead: the other
 * way into the page cache (page faults on first touch instead of a system call per write).
 *
 * Prints the CPU (user + system, getrusage) per round trip in microseconds: what no user-space change in fluxd can
 * remove while it writes those bytes with write(2). DIR should be on the file system of the data directory. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <unistd.h>

static double cpu_seconds(void) {
    struct rusage r;
    getrusage(RUSAGE_SELF, &r);
    return r.ru_utime.tv_sec + r.ru_utime.tv_usec / 1e6 + r.ru_stime.tv_sec + r.ru_stime.tv_usec / 1e6;
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: %s DIR [BYTES_PER_ROUND_TRIP] [ROUND_TRIPS_PER_WRITE] [ROUND_TRIPS]\n", argv[0]);
        return 2;
    }
    const char *dir = argv[1];
    long per_rt = argc > 2 ? atol(argv[2]) : 378;
    long per_write = argc > 3 ? atol(argv[3]) : 64;
    long total_rt = argc > 4 ? atol(argv[4]) : 2000000;
    int use_mmap = argc > 5 && strcmp(argv[5], "mmap") == 0;
    char *map = NULL;
    const long segment = 16L << 20;
    size_t chunk = (size_t)(per_rt * per_write);
    char *buf = malloc(chunk);
    memset(buf, 'x', chunk);
    char path[4096];
    int fd = -1, n = 0;
    long offset = segment;
    double start = cpu_seconds();
    for (long done = 0; done < total_rt; done += per_write) {
        if (offset + (long)chunk > segment) {  /* a new segment, allocated ahead as the journal does */
            if (map) munmap(map, (size_t)segment);
            if (fd >= 0) { close(fd); unlink(path); }
            snprintf(path, sizeof path, "%s/pwrite-floor-%d.seg", dir, n++);
            fd = open(path, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
            if (fd < 0 || fallocate(fd, 0, 0, segment) != 0) { perror(path); return 1; }
            if (use_mmap) {
                map = mmap(NULL, (size_t)segment, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
                if (map == MAP_FAILED) { perror("mmap"); return 1; }
            }
            offset = 0;
        }
        if (use_mmap) {
            memcpy(map + offset, buf, chunk);
        } else if (pwrite(fd, buf, chunk, offset) != (ssize_t)chunk) {
            perror("pwrite");
            return 1;
        }
        offset += (long)chunk;
    }
    double cpu = cpu_seconds() - start;
    if (map) munmap(map, (size_t)segment);
    if (fd >= 0) { close(fd); unlink(path); }
    printf("%s: %ld bytes per round trip, %ld round trips per write: %.3f us CPU per round trip (%.1f MB in %.2f s CPU)\n",
           use_mmap ? "mmap" : "pwrite", per_rt, per_write, cpu * 1e6 / (double)total_rt, (double)total_rt * per_rt / 1e6, cpu);
    return 0;
}
