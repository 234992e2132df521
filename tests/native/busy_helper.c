/*
 * A process for the sampler's tests and benchmark (tests/tests/sampler.rs,
 * tests/src/bin/sampler_bench.rs), compiled by them with `gcc -O1 -fno-omit-frame-pointer`
 * so that its functions keep a frame-pointer chain the kernel can walk.
 *
 *   busy_helper spin CPU_MS       outer() and inner() take 1 and 3 parts of the work until the
 *                                 process has used CPU_MS of CPU; prints
 *                                 `FUNCTION <name> <address>` for both, then `READY <pid>`,
 *                                 waits for a line on stdin, spins, prints `DONE`, and waits
 *                                 for stdin to close.
 *   busy_helper syscalls CPU_MS   the same, spinning in read() of /dev/zero (time in the kernel).
 *   busy_helper sleep COUNT MS    prints `READY <pid>`, waits for a line, then a thread prints
 *                                 `SLEEPER <tid>` and sleeps COUNT times MS in nanosleep (at 8
 *                                 call depths in turn: 8 user stacks); then `DONE`, and it waits
 *                                 for stdin to close.
 *   busy_helper throughput MS     spins outer() on one thread per online CPU for MS of wall
 *                                 time; prints `UNITS_PER_SECOND <n>` (outer() calls a second).
 *
 * CPU time is read with getrusage, a plain syscall: clock_gettime would enter the kernel from
 * the vDSO, outside the helper's text and libc.
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

/* Iterations of one part of the work (about a millisecond). */
#define PART 400000UL
/* The call depths naps take turns at: as many distinct user stacks. */
#define NAP_DEPTHS 8

static volatile unsigned long sink;

/*
 * Called by inner() so that inner() is no leaf function: GCC 12 gives leaf functions no frame
 * even with -mno-omit-leaf-frame-pointer, and a sample in a frameless function loses its caller.
 */
__attribute__((noinline, noclone)) void not_a_leaf(void)
{
    __asm__ volatile("");
}

/* Three parts of the work, called from outer(): its samples' next frame is in outer(). */
__attribute__((noinline, noclone)) void inner(unsigned long n)
{
    not_a_leaf();
    for (unsigned long i = 0; i < n; i++)
        sink += i;
}

/* One part of the work itself, three in inner(): a 1:3 split of the CPU time. */
__attribute__((noinline, noclone)) void outer(unsigned long n)
{
    inner(3 * n);
    for (unsigned long i = 0; i < n; i++)
        sink += i;
}

static long cpu_ms(void)
{
    struct rusage usage;
    getrusage(RUSAGE_SELF, &usage);
    return (usage.ru_utime.tv_sec + usage.ru_stime.tv_sec) * 1000L +
           (usage.ru_utime.tv_usec + usage.ru_stime.tv_usec) / 1000L;
}

static void wait_for_line(void)
{
    char line[64];
    if (!fgets(line, sizeof line, stdin))
        exit(1);
}

static void wait_for_eof(void)
{
    char line[64];
    while (fgets(line, sizeof line, stdin))
        ;
}

static void ready(void)
{
    printf("READY %d\n", getpid());
    fflush(stdout);
    wait_for_line();
}

static void done(void)
{
    printf("DONE\n");
    fflush(stdout);
    wait_for_eof();
}

static void spin(long ms)
{
    printf("FUNCTION outer %p\nFUNCTION inner %p\n", (void *)outer, (void *)inner);
    ready();
    long until = cpu_ms() + ms;
    while (cpu_ms() < until)
        outer(PART);
    done();
}

static void syscalls(long ms)
{
    static char buf[65536];
    int fd = open("/dev/zero", O_RDONLY);
    if (fd < 0) {
        perror("/dev/zero");
        exit(1);
    }
    ready();
    long until = cpu_ms() + ms;
    while (cpu_ms() < until)
        for (int i = 0; i < 16; i++)
            if (read(fd, buf, sizeof buf) != sizeof buf)
                exit(1);
    done();
}

struct naps {
    long count;
    long ms;
};

/* Naps at `depth` calls below the sleeper: naps at different depths have different stacks. */
__attribute__((noinline, noclone)) void nap(const struct timespec *length, int depth)
{
    if (depth == 0) {
        nanosleep(length, NULL);
        return;
    }
    nap(length, depth - 1);
    sink++; /* not a tail call: each depth keeps its frame */
}

static void *sleeper(void *arg)
{
    struct naps *naps = arg;
    printf("SLEEPER %ld\n", (long)syscall(SYS_gettid));
    fflush(stdout);
    struct timespec length = {naps->ms / 1000, (naps->ms % 1000) * 1000000L};
    for (long i = 0; i < naps->count; i++)
        nap(&length, i % NAP_DEPTHS);
    return NULL;
}

static void sleep_naps(long count, long ms)
{
    struct naps naps = {count, ms};
    pthread_t thread;
    ready();
    if (pthread_create(&thread, NULL, sleeper, &naps) != 0)
        exit(1);
    pthread_join(thread, NULL);
    done();
}

static atomic_int stop;

static void *spin_units(void *arg)
{
    unsigned long *units = arg;
    while (!atomic_load_explicit(&stop, memory_order_relaxed)) {
        outer(PART);
        (*units)++;
    }
    return NULL;
}

static void throughput(long ms)
{
    long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    pthread_t threads[cpus];
    unsigned long units[cpus];
    memset(units, 0, sizeof units);
    struct timespec start, end;
    clock_gettime(CLOCK_MONOTONIC, &start);
    for (long i = 0; i < cpus; i++)
        if (pthread_create(&threads[i], NULL, spin_units, &units[i]) != 0)
            exit(1);
    struct timespec wall = {ms / 1000, (ms % 1000) * 1000000L};
    nanosleep(&wall, NULL);
    atomic_store(&stop, 1);
    unsigned long total = 0;
    for (long i = 0; i < cpus; i++) {
        pthread_join(threads[i], NULL);
        total += units[i];
    }
    clock_gettime(CLOCK_MONOTONIC, &end);
    double seconds = (end.tv_sec - start.tv_sec) + (end.tv_nsec - start.tv_nsec) / 1e9;
    printf("UNITS_PER_SECOND %.1f\n", total / seconds);
}

int main(int argc, char **argv)
{
    if (argc >= 3 && strcmp(argv[1], "spin") == 0)
        spin(atol(argv[2]));
    else if (argc >= 3 && strcmp(argv[1], "syscalls") == 0)
        syscalls(atol(argv[2]));
    else if (argc >= 4 && strcmp(argv[1], "sleep") == 0)
        sleep_naps(atol(argv[2]), atol(argv[3]));
    else if (argc >= 3 && strcmp(argv[1], "throughput") == 0)
        throughput(atol(argv[2]));
    else {
        fprintf(stderr, "usage: %s spin CPU_MS | syscalls CPU_MS | sleep COUNT MS | "
                        "throughput MS\n", argv[0]);
        return 2;
    }
    return 0;
}
