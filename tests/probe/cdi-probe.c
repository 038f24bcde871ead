/*
 * What a container sees, for the CDI test (tests/tests/cdi_podman.rs): built static, it is the
 * whole image. For each path argument one line: a device node's type, major, minor and what
 * opening it for reading and for writing gives (0 or the errno: the device cgroup answers
 * EPERM before any driver is asked), or a file's first line and what writing to it gives.
 * Then every environment variable and every mount point with its options.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

extern char **environ;

static int open_errno(const char *path, int flags) {
    int fd = open(path, flags | O_NONBLOCK | O_NOCTTY);
    if (fd < 0)
        return errno;
    close(fd);
    return 0;
}

int main(int argc, char **argv) {
    for (int i = 1; i < argc; i++) {
        struct stat st;
        if (stat(argv[i], &st) != 0) {
            printf("missing %s %d\n", argv[i], errno);
        } else if (S_ISCHR(st.st_mode) || S_ISBLK(st.st_mode)) {
            printf("node %s %c %u %u %d %d\n", argv[i], S_ISCHR(st.st_mode) ? 'c' : 'b',
                   major(st.st_rdev), minor(st.st_rdev), open_errno(argv[i], O_RDONLY),
                   open_errno(argv[i], O_WRONLY));
        } else {
            char line[256] = "";
            FILE *f = fopen(argv[i], "r");
            if (f) {
                if (!fgets(line, sizeof line, f))
                    line[0] = 0;
                fclose(f);
            }
            line[strcspn(line, "\n")] = 0;
            printf("file %s %d %s\n", argv[i], open_errno(argv[i], O_WRONLY), line);
        }
    }
    for (char **e = environ; *e; e++)
        printf("env %s\n", *e);
    /* mountinfo: id parent maj:min root mount-point options ... */
    FILE *m = fopen("/proc/self/mountinfo", "r");
    char line[4096];
    while (m && fgets(line, sizeof line, m)) {
        char point[1024], options[1024];
        if (sscanf(line, "%*s %*s %*s %*s %1023s %1023s", point, options) == 2)
            printf("mount %s %s\n", point, options);
    }
    return 0;
}
