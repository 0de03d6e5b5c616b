/* LD_PRELOAD shim for bench/group_commit.py --sync-ms: every fsync and
 * fdatasync sleeps SLOWSYNC_US microseconds before doing the real call, the
 * way a disk without a volatile write cache (or a network volume) makes a
 * flush cost about a millisecond. This VM's virtual disk answers a flush in
 * ~40 us, which hides what group commit saves. Bench only, never shipped. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdlib.h>
#include <unistd.h>

static void pause_for_flush(void) {
    const char *us = getenv("SLOWSYNC_US");
    if (us != NULL) usleep((useconds_t)atoi(us));
}

int fsync(int fd) {
    static int (*real)(int);
    if (!real) real = (int (*)(int))dlsym(RTLD_NEXT, "fsync");
    pause_for_flush();
    return real(fd);
}

int fdatasync(int fd) {
    static int (*real)(int);
    if (!real) real = (int (*)(int))dlsym(RTLD_NEXT, "fdatasync");
    pause_for_flush();
    return real(fd);
}
