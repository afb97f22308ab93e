/*
 * pgscope-shmem-sampler: copies a few fields of every slot in use of two arrays in a mapped
 * file, at a fixed rate, and writes them out once per batch of ticks.
 *
 * Why compiled: the activity sampler's shared-memory source (collect/sampling/activitymem.py) reads
 * PostgreSQL's PGPROC and backend status arrays 100 times a second. In Python each tick cost
 * ~0.12 ms of CPU on our 2-core VM, mostly the interpreter waking cache-cold; here it costs
 * ~15 us (docs/benchmarks.md, "A sampler that reads shared memory"). It knows nothing of
 * PostgreSQL: the Python side finds the layout (collect/sampling/shmem.py) and names what it reads.
 *
 * Usage: pgscope-shmem-sampler FD SIZE HZ TICKS_PER_BATCH
 *            PROCS COUNT STRIDE PID WAIT
 *            STATUSES COUNT STRIDE PID STATE TYPE QUERY_ID LEADER PROCS_AT
 * FD is the mapping, opened by the caller (this program needs no rights of its own); SIZE
 * its length; the other numbers are byte offsets into it and slot counts and
 * strides. QUERY_ID -1: no query_id field. A proc slot is in use when its pid field is not
 * 0; its status slot is the one holding the same pid. LEADER is the offset in a proc slot of
 * its lock group leader (PGPROC.lockGroupLeader, a pointer in the server's address space:
 * a parallel worker's leader), -1 for none; PROCS_AT where the proc array starts in the
 * server's address space, for that pointer to name a slot.
 *
 * Output, per batch (native byte order): uint32 magic 0x53534750 ("PGSS"), uint32 ticks,
 * uint32 rows, uint32 0, int64 this process's CPU time so far (ns); then per tick int64
 * wall-clock time (us since the epoch), int32 lateness (us), int32 read time (ns); per row (a
 * process at a tick) int32 tick, int32 pid, uint32 wait_event_info, int32 state, int32
 * backend type (both -1: no status slot), int64 query_id, int32 the pid of its lock group's
 * leader when that is another process (a parallel worker's leader), else 0. Columns, not records, so that the
 * reader takes each as one array.
 *
 * It stops, writing what it holds, on SIGTERM or SIGINT, and when its parent dies. Exit
 * codes: 0 stopped, 1 a system call failed, 2 bad arguments (a message on stderr).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <time.h>
#include <unistd.h>

#define MAGIC 0x53534750u

typedef struct {
    long offset, count, stride;
} Array;

static volatile sig_atomic_t stopping;

static void on_signal(int sig) {
    (void)sig;
    stopping = 1;
}

static long number(const char *text, const char *what, long low, long high) {
    char *end;
    errno = 0;
    long value = strtol(text, &end, 10);
    if (errno || *end || value < low || value > high) {
        fprintf(stderr, "pgscope-shmem-sampler: bad %s: %s\n", what, text);
        exit(2);
    }
    return value;
}

static void check_fields(Array a, long size, const long *fields, int n, const char *what) {
    if (a.count < 1 || a.stride < 8 || a.offset < 0 || a.offset + a.count * a.stride > size) {
        fprintf(stderr, "pgscope-shmem-sampler: the %s array lies outside the mapping\n", what);
        exit(2);
    }
    for (int i = 0; i < n; i++)
        if (fields[i] < 0 || fields[i] + 8 > a.stride || fields[i] % 4) {
            fprintf(stderr, "pgscope-shmem-sampler: a %s field lies outside its slot\n", what);
            exit(2);
        }
}

static int write_all(const void *data, size_t size) {
    const char *p = data;
    while (size) {
        ssize_t n = write(1, p, size);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) return -1;
        p += n;
        size -= (size_t)n;
    }
    return 0;
}

/* One batch's columns. */
typedef struct {
    uint32_t ticks, rows;
    int64_t *tick_us;
    int32_t *late_us, *read_ns;
    int32_t *tick, *pid, *state, *type;
    uint32_t *wait;
    int64_t *query;
    int32_t *leader;
} Batch;

static int flush(Batch *b) {
    struct timespec cpu;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &cpu);
    uint32_t head[4] = {MAGIC, b->ticks, b->rows, 0};
    int64_t cpu_ns = (int64_t)cpu.tv_sec * 1000000000 + cpu.tv_nsec;
    size_t t = b->ticks, r = b->rows;
    int failed = write_all(head, sizeof head) || write_all(&cpu_ns, 8) ||
                 write_all(b->tick_us, 8 * t) || write_all(b->late_us, 4 * t) ||
                 write_all(b->read_ns, 4 * t) || write_all(b->tick, 4 * r) ||
                 write_all(b->pid, 4 * r) || write_all(b->wait, 4 * r) ||
                 write_all(b->state, 4 * r) || write_all(b->type, 4 * r) ||
                 write_all(b->query, 8 * r) || write_all(b->leader, 4 * r);
    b->ticks = b->rows = 0;
    return failed ? -1 : 0;
}

static void *columns(size_t n, size_t width) {
    void *p = calloc(n ? n : 1, width);
    if (!p) {
        perror("pgscope-shmem-sampler: calloc");
        exit(1);
    }
    return p;
}

int main(int argc, char **argv) {
    if (argc != 19) {
        fprintf(stderr, "usage: pgscope-shmem-sampler FD SIZE HZ TICKS_PER_BATCH PROCS COUNT "
                        "STRIDE PID WAIT STATUSES COUNT STRIDE PID STATE TYPE QUERY_ID LEADER "
                        "PROCS_AT\n");
        return 2;
    }
    argv++; /* argv[0] is now FD */
    int fd = (int)number(argv[0], "file descriptor", 0, 1 << 20);
    long size = number(argv[1], "size", 1, 1L << 46);
    long hz = number(argv[2], "rate", 1, 10000);
    long per_batch = number(argv[3], "batch", 1, 100000);
    Array procs = {number(argv[4], "offset", 0, size), number(argv[5], "count", 1, 1 << 20),
                   number(argv[6], "stride", 8, 1 << 16)};
    long p_fields[2] = {number(argv[7], "field", 0, 1 << 16), number(argv[8], "field", 0, 1 << 16)};
    Array stats = {number(argv[9], "offset", 0, size), number(argv[10], "count", 1, 1 << 20),
                   number(argv[11], "stride", 8, 1 << 16)};
    long s_fields[4] = {number(argv[12], "field", 0, 1 << 16), number(argv[13], "field", 0, 1 << 16),
                        number(argv[14], "field", 0, 1 << 16), number(argv[15], "field", -1, 1 << 16)};
    long leader_at = number(argv[16], "field", -1, 1 << 16);
    errno = 0;
    char *end;
    uint64_t procs_at = strtoull(argv[17], &end, 10);
    if (errno || *end || !*argv[17] || (leader_at >= 0 && leader_at % 8)) {
        fprintf(stderr, "pgscope-shmem-sampler: bad leader field or address: %s %s\n", argv[16],
                argv[17]);
        return 2;
    }
    long p_check[3] = {p_fields[0], p_fields[1], leader_at};
    check_fields(procs, size, p_check, leader_at < 0 ? 2 : 3, "proc");
    check_fields(stats, size, s_fields, s_fields[3] < 0 ? 3 : 4, "status");

    const char *base = mmap(NULL, (size_t)size, PROT_READ, MAP_SHARED, fd, 0);
    if (base == MAP_FAILED) {
        perror("pgscope-shmem-sampler: mmap");
        return 1;
    }
    struct sigaction sa = {0};
    sa.sa_handler = on_signal;
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
    signal(SIGPIPE, SIG_IGN);
    prctl(PR_SET_PDEATHSIG, SIGTERM);
    if (getppid() == 1) stopping = 1; /* the parent died before prctl */

    Batch b = {0};
    b.tick_us = columns(per_batch, 8);
    b.late_us = columns(per_batch, 4);
    b.read_ns = columns(per_batch, 4);
    size_t cap = (size_t)per_batch * procs.count;
    b.tick = columns(cap, 4);
    b.pid = columns(cap, 4);
    b.wait = columns(cap, 4);
    b.state = columns(cap, 4);
    b.type = columns(cap, 4);
    b.query = columns(cap, 8);
    b.leader = columns(cap, 4);
    const uint64_t procs_span = (uint64_t)procs.count * (uint64_t)procs.stride;
    long *status_of = columns((size_t)procs.count, sizeof(long));
    for (long i = 0; i < procs.count; i++) status_of[i] = -1;

    const long interval = 1000000000L / hz;
    struct timespec due, now, read_end, wall;
    clock_gettime(CLOCK_MONOTONIC, &due);
    while (!stopping) {
        /* Sleep to the schedule (no drift); if we fell a whole interval behind, skip ahead
           rather than burst. */
        due.tv_nsec += interval;
        while (due.tv_nsec >= 1000000000L) {
            due.tv_nsec -= 1000000000L;
            due.tv_sec++;
        }
        if (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &due, NULL) == EINTR) continue;
        clock_gettime(CLOCK_MONOTONIC, &now);
        clock_gettime(CLOCK_REALTIME, &wall);
        int64_t late = ((int64_t)now.tv_sec - due.tv_sec) * 1000000000 + now.tv_nsec - due.tv_nsec;
        if (late > interval) due = now;

        uint32_t t = b.ticks;
        for (long i = 0; i < procs.count; i++) {
            const char *slot = base + procs.offset + i * procs.stride;
            int32_t pid = *(const volatile int32_t *)(slot + p_fields[0]);
            if (pid == 0) continue;
            uint32_t r = b.rows++;
            b.tick[r] = (int32_t)t;
            b.pid[r] = pid;
            b.wait[r] = *(const volatile uint32_t *)(slot + p_fields[1]);
            b.state[r] = b.type[r] = -1;
            b.query[r] = 0;
            b.leader[r] = 0;
            if (leader_at >= 0) {
                /* Its lock group's leader, when another process: the slot the pointer names
                   (a pointer that names no slot start is not followed). */
                uint64_t to = *(const volatile uint64_t *)(slot + leader_at) - procs_at;
                if (to < procs_span && to % (uint64_t)procs.stride == 0 &&
                    (long)(to / (uint64_t)procs.stride) != i)
                    b.leader[r] = *(const volatile int32_t *)(base + procs.offset + (long)to +
                                                              p_fields[0]);
            }
            /* The process's status slot: remembered, and looked for again only when its pid
               is no longer there. Scanning the whole status array every tick cost ~40% of
               the reads (each slot's pid is a cache line of its own, cold after a sleep). */
            long j = status_of[i];
            if (j < 0 || *(const volatile int32_t *)(base + stats.offset + j * stats.stride +
                                                      s_fields[0]) != pid) {
                j = -1;
                for (long k = 0; k < stats.count && j < 0; k++)
                    if (*(const volatile int32_t *)(base + stats.offset + k * stats.stride +
                                                    s_fields[0]) == pid)
                        j = k;
                status_of[i] = j;
                if (j < 0) continue;
            }
            const char *status = base + stats.offset + j * stats.stride;
            b.state[r] = *(const volatile int32_t *)(status + s_fields[1]);
            b.type[r] = *(const volatile int32_t *)(status + s_fields[2]);
            if (s_fields[3] >= 0) b.query[r] = *(const volatile int64_t *)(status + s_fields[3]);
        }
        clock_gettime(CLOCK_MONOTONIC, &read_end);
        b.tick_us[t] = (int64_t)wall.tv_sec * 1000000 + wall.tv_nsec / 1000;
        b.late_us[t] = (int32_t)(late / 1000);
        b.read_ns[t] = (int32_t)(((int64_t)read_end.tv_sec - now.tv_sec) * 1000000000 +
                                 read_end.tv_nsec - now.tv_nsec);
        b.ticks++;
        if (b.ticks == (uint32_t)per_batch && flush(&b)) return 1;
    }
    if (b.ticks && flush(&b)) return 1;
    return 0;
}
