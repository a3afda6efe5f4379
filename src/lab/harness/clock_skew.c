/* LD_PRELOAD shim: adds an offset in milliseconds, read from the 8-byte file named by
 * LOCKEDJOB_CLOCK_SKEW_FILE (mapped, so a write is seen at once), to CLOCK_REALTIME. Makes the
 * system call itself and never allocates, so it is safe under jemalloc (see clock.rs). */
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

static volatile int64_t *offset_ms;

static int64_t skew_ms(void) {
    if (!offset_ms) {
        const char *path = getenv("LOCKEDJOB_CLOCK_SKEW_FILE");
        int fd = path ? open(path, O_RDONLY) : -1;
        if (fd < 0) return 0;
        void *p = mmap(0, 8, PROT_READ, MAP_SHARED, fd, 0);
        close(fd);
        if (p == MAP_FAILED) return 0;
        offset_ms = p;
    }
    return *offset_ms;
}

int clock_gettime(clockid_t id, struct timespec *ts) {
    int rc = syscall(SYS_clock_gettime, id, ts);
    if (rc == 0 && (id == CLOCK_REALTIME || id == CLOCK_REALTIME_COARSE)) {
        int64_t ns = (int64_t)ts->tv_nsec + (skew_ms() % 1000) * 1000000;
        ts->tv_sec += skew_ms() / 1000 + ns / 1000000000;
        ns %= 1000000000;
        if (ns < 0) { ns += 1000000000; ts->tv_sec -= 1; }
        ts->tv_nsec = ns;
    }
    return rc;
}

int gettimeofday(struct timeval *tv, void *tz) {
    struct timespec ts;
    (void)tz;
    if (clock_gettime(CLOCK_REALTIME, &ts) != 0) return -1;
    tv->tv_sec = ts.tv_sec;
    tv->tv_usec = ts.tv_nsec / 1000;
    return 0;
}

time_t time(time_t *out) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    if (out) *out = ts.tv_sec;
    return ts.tv_sec;
}
