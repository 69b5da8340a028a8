/* Loads an exported model and runs its decode step with every way of starting a process
 * interposed: a call to any of them ends this program with exit status 3 and names it. The
 * runtime must not start one (no compiler probe, no helper). `--selftest` calls popen itself,
 * to show the interposition works. */
#include <sinter/sinter_rt.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

static void caught(const char* what) {
  static const char msg[] = "started a process: ";
  (void)!write(2, msg, sizeof msg - 1);
  (void)!write(2, what, strlen(what));
  (void)!write(2, "\n", 1);
  _exit(3);
}
pid_t fork(void) { caught("fork"); return -1; }
pid_t vfork(void) { caught("vfork"); return -1; }
int execve(const char* p, char* const a[], char* const e[]) { (void)p, (void)a, (void)e; caught("execve"); return -1; }
int execv(const char* p, char* const a[]) { (void)p, (void)a; caught("execv"); return -1; }
int execvp(const char* p, char* const a[]) { (void)p, (void)a; caught("execvp"); return -1; }
int system(const char* c) { (void)c; caught("system"); return -1; }
FILE* popen(const char* c, const char* m) { (void)c, (void)m; caught("popen"); return NULL; }
int posix_spawn(void) { caught("posix_spawn"); return -1; }
int posix_spawnp(void) { caught("posix_spawnp"); return -1; }

int main(int argc, char** argv) {
  if (argc != 2) return 2;
  if (!strcmp(argv[1], "--selftest")) return popen("true", "r") ? 0 : 1;
  sinter_rt_model* m = sinter_rt_load(argv[1]);
  if (!m) return fprintf(stderr, "%s\n", sinter_rt_last_error()), 1;
  sinter_rt_session* s = sinter_rt_session_new(m);
  int64_t token = 65;
  sinter_rt_tensor in = {&token, SINTER_RT_I64, 2, {1, 1}, 0}, out = {0};
  if (!s || sinter_rt_run(s, "decode", &in, 1, &out, 1) != 0) return fprintf(stderr, "%s\n", sinter_rt_last_error()), 1;
  sinter_rt_session_free(s);
  sinter_rt_model_free(m);
  puts("ok");
  return 0;
}
