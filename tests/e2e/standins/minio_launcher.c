/*
 * STAND-IN for MinIO (tests only): the executable part of the stand-in `minio` release
 * file that tests/e2e/standins/minio.py builds. The file is this program, compiled
 * statically, with a zip archive appended whose __main__.py is the stand-in server
 * (tests/e2e/standins/minio_standin.py). Python runs a zip archive with data before it.
 *
 * Why a compiled launcher and not a script: the deploy tells which release a running
 * server was started from by /proc/<MainPID>/exe (aicluster.facts.minio), as it is for
 * the real, compiled MinIO. A script's process is its interpreter's, so the stand-in's
 * main process must be a binary of its own. It stays the unit's main process:
 *
 *   - starts python3 on its own file (the path /proc/self/exe names), with its arguments;
 *   - forwards SIGTERM, SIGINT and SIGHUP to it;
 *   - sends systemd the readiness message the server writes to the pipe whose number is
 *     in $AICLUSTER_STANDIN_READY_FD (systemd accepts it only from the main process,
 *     NotifyAccess=main), to $NOTIFY_SOCKET;
 *   - exits with the server's status.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <signal.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#define PYTHON "/usr/bin/python3"

static volatile pid_t child = 0;

static void forward(int sig) {
    if (child > 0)
        kill(child, sig);
}

static void notify(const char *message, size_t length) {
    const char *path = getenv("NOTIFY_SOCKET");
    struct sockaddr_un addr;
    size_t n;
    int fd;

    if (path == NULL || path[0] == '\0')
        return;
    n = strlen(path);
    if (n >= sizeof(addr.sun_path)) {
        fprintf(stderr, "STAND-IN minio launcher: NOTIFY_SOCKET too long\n");
        return;
    }
    memset(&addr, 0, sizeof(addr));
    addr.sun_family = AF_UNIX;
    memcpy(addr.sun_path, path, n);
    if (addr.sun_path[0] == '@')
        addr.sun_path[0] = '\0'; /* the abstract namespace */
    fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    if (fd < 0) {
        perror("STAND-IN minio launcher: socket");
        return;
    }
    if (sendto(fd, message, length, 0, (struct sockaddr *)&addr,
               (socklen_t)(offsetof(struct sockaddr_un, sun_path) + n)) < 0)
        perror("STAND-IN minio launcher: sendto NOTIFY_SOCKET");
    close(fd);
}

int main(int argc, char **argv) {
    char self[4096];
    char fdtext[16];
    char message[4096];
    size_t used = 0;
    ssize_t n;
    int ready[2];
    int status = 0;
    char **args;
    struct sigaction sa;

    n = readlink("/proc/self/exe", self, sizeof(self) - 1);
    if (n < 0) {
        perror("STAND-IN minio launcher: readlink /proc/self/exe");
        return 1;
    }
    self[n] = '\0';
    if (pipe(ready) < 0) {
        perror("STAND-IN minio launcher: pipe");
        return 1;
    }
    args = calloc((size_t)argc + 3, sizeof(char *));
    if (args == NULL)
        return 1;
    args[0] = "python3";
    args[1] = "-I"; /* isolated: no PYTHON* variables, no user site */
    args[2] = self;
    for (int i = 1; i < argc; i++)
        args[i + 2] = argv[i];

    memset(&sa, 0, sizeof(sa));
    sa.sa_handler = forward;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGHUP, &sa, NULL);

    child = fork();
    if (child < 0) {
        perror("STAND-IN minio launcher: fork");
        return 1;
    }
    if (child == 0) {
        close(ready[0]);
        snprintf(fdtext, sizeof(fdtext), "%d", ready[1]);
        setenv("AICLUSTER_STANDIN_READY_FD", fdtext, 1);
        unsetenv("NOTIFY_SOCKET");
        execv(PYTHON, args);
        perror("STAND-IN minio launcher: exec " PYTHON);
        _exit(127);
    }
    close(ready[1]);
    /* The readiness message, until the server closes its end (or exits). */
    for (;;) {
        n = read(ready[0], message + used, sizeof(message) - 1 - used);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            break;
        used += (size_t)n;
        if (used == sizeof(message) - 1)
            break;
    }
    close(ready[0]);
    if (used > 0)
        notify(message, used);
    while (waitpid(child, &status, 0) < 0) {
        if (errno != EINTR) {
            perror("STAND-IN minio launcher: waitpid");
            return 1;
        }
    }
    if (WIFEXITED(status))
        return WEXITSTATUS(status);
    return 128 + WTERMSIG(status);
}
