/*
 * The one program of the e2e suite's images (tests/e2e/run.sh builds it static and puts it in
 * an image FROM scratch): no registry is reachable from the cluster, so the pause image and the
 * test pods' image are made here.
 *
 *   probe PATH...            for each path one line "open PATH 0", or the errno opening it for
 *                            reading and writing gave (the device cgroup answers EPERM, a node
 *                            the runtime did not create ENOENT); then exits
 *   probe --sleep [PATH...]  the same, then waits for SIGTERM or SIGINT, reaping children
 *                            (the pause container, and a test pod that keeps its device)
 */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

static void stop(int sig) {
    (void)sig;
    _exit(0);
}

static void reap(int sig) {
    (void)sig;
    while (waitpid(-1, NULL, WNOHANG) > 0) {
    }
}

int main(int argc, char **argv) {
    int sleep_after = argc > 1 && strcmp(argv[1], "--sleep") == 0;
    for (int i = 1 + sleep_after; i < argc; i++) {
        int fd = open(argv[i], O_RDWR | O_NONBLOCK | O_NOCTTY);
        printf("open %s %d\n", argv[i], fd < 0 ? errno : 0);
        if (fd >= 0)
            close(fd);
    }
    fflush(stdout);
    if (!sleep_after)
        return 0;
    signal(SIGTERM, stop);
    signal(SIGINT, stop);
    signal(SIGCHLD, reap);
    for (;;)
        pause();
}
