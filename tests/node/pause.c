/* The pause container of the real node's pods (and the node's own init): it
 * holds the pod's namespaces, reaps the children reparented to it, and exits
 * on SIGINT or SIGTERM. Built static (musl-gcc) by tests/node/build.sh: no
 * registry here, so no registry.k8s.io/pause. */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
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
  if (argc > 1 && strcmp(argv[1], "-v") == 0) {
    puts("nmo-rs pause 3.10");
    return 0;
  }
  struct sigaction on_stop = {.sa_handler = stop};
  struct sigaction on_child = {.sa_handler = reap, .sa_flags = SA_NOCLDSTOP};
  if (sigaction(SIGINT, &on_stop, NULL) < 0 || sigaction(SIGTERM, &on_stop, NULL) < 0 ||
      sigaction(SIGCHLD, &on_child, NULL) < 0) {
    perror("pause: sigaction");
    return 1;
  }
  for (;;) {
    pause();
  }
}
