/* The sandbox ("pause") container of every pod on the real-node test cluster: it holds the pod's
 * namespaces, reaps the zombies handed to it, and exits at once on SIGTERM or SIGINT. No registry is
 * reachable here, so hack/build-node-images.sh builds this one instead of pulling registry.k8s.io/pause. */
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

static void stop(int sig) { (void)sig; _exit(0); }

static void reap(int sig) {
  (void)sig;
  while (waitpid(-1, 0, WNOHANG) > 0) {
  }
}

int main(void) {
  struct sigaction on_stop = {.sa_handler = stop};
  struct sigaction on_child = {.sa_handler = reap, .sa_flags = SA_NOCLDSTOP | SA_RESTART};
  sigaction(SIGINT, &on_stop, 0);
  sigaction(SIGTERM, &on_stop, 0);
  sigaction(SIGCHLD, &on_child, 0);
  for (;;) pause();
}
