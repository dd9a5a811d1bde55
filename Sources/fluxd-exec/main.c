// fluxd-exec: how fluxd starts a supervised worker so that it does not outlive fluxd (issue 15).
//
//     fluxd-exec PARENT-PID COMMAND [ARG...]
//
// Asks the kernel to SIGKILL this process when its parent dies (prctl PR_SET_PDEATHSIG), checks that the parent
// is still PARENT-PID (if fluxd died before the prctl, the death signal would never come), then execs COMMAND in
// place: the worker keeps this pid, and the death signal survives the exec. fluxd spawns workers from its loop
// thread, which lives as long as fluxd (the signal follows the spawning thread, not the process), so a worker
// dies with fluxd however fluxd ends (SIGKILL, crash) instead of lingering as an orphan that holds its store
// names against the next fluxd's workers; the next fluxd starts them again and they resume from the journal.
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <unistd.h>

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: fluxd-exec PARENT-PID COMMAND [ARG...]\n");
        return 2;
    }
    long parent = strtol(argv[1], NULL, 10);
    if (prctl(PR_SET_PDEATHSIG, SIGKILL) != 0) {
        fprintf(stderr, "fluxd-exec: prctl(PR_SET_PDEATHSIG): %s\n", strerror(errno));
        return 126;
    }
    if ((long)getppid() != parent) return 125;  // fluxd is already gone
    // ETXTBSY: the command was just written (an install replacing it, a test writing a script) and some process
    // still holds it open for writing -- typically another thread's fork that has not reached its exec yet, which
    // closes it. That passes within milliseconds: try again for up to a second before calling it a failure.
    for (int tries = 0; tries < 100; tries++) {
        execvp(argv[2], &argv[2]);
        if (errno != ETXTBSY) break;
        usleep(10000);
    }
    fprintf(stderr, "fluxd-exec: cannot run %s: %s\n", argv[2], strerror(errno));
    return errno == ENOENT ? 127 : 126;
}
