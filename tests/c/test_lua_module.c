/* test_lua_module.c — the Lua module (build/lua/crun/core.so) as a plain
 * lua5.4 loads it with require, and unloads it at lua_close. */
#include "harness.h"

#include <lauxlib.h>
#include <lua.h>
#include <lualib.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <dirent.h>
#include <fcntl.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

/* Runs `code` in a fresh Lua state that finds the build's crun.core, closes
 * the state (lua_close dlcloses the module, as os.exit(c, true) does), then
 * raises SIGUSR1; returns the wait status of the child that did it. */
static int after_close_usr1(const char *code, const char *flight_dir) {
  const char *build = getenv("CRUN_BUILD_DIR");
  EXPECT(build != NULL);
  pid_t pid = fork();
  if (pid == 0) {
    setenv("CRUN_FLIGHT_DIR", flight_dir, 1);
    lua_State *L = luaL_newstate();
    luaL_openlibs(L);
    char all[4096];
    snprintf(all, sizeof all, "package.cpath = '%s/lua/?.so'\n%s", build ? build : ".", code);
    if (luaL_dostring(L, all) != LUA_OK) {
      fprintf(stderr, "%s\n", lua_tostring(L, -1));
      _exit(3);
    }
    lua_close(L);
    kill(getpid(), SIGUSR1); /* process-directed: a TSan build's dump thread takes it in sigwaitinfo */
    usleep(300000); /* the dump thread's turn */
    _exit(0);
  }
  int st = 0;
  EXPECT(pid > 0 && waitpid(pid, &st, 0) == pid);
  return st;
}

/* The flight recorder's SIGUSR1 handler and dump thread (armed by
 * dist.init_process_group) outlive lua_close: the module stays mapped, so a
 * SIGUSR1 while the process exits still dumps (it ran the handler's
 * unmapped code: SIGSEGV at exit). */
TEST(sigusr1_after_lua_close) {
  char dir[PATH_MAX];
  crun_test_tmp_path(dir, sizeof dir, "crun-test-luamod-XXXXXX");
  EXPECT(mkdtemp(dir) != NULL);
  int st = after_close_usr1("require('crun.core').flight_arm()", dir);
  EXPECT(WIFEXITED(st) && WEXITSTATUS(st) == 0);
  if (WIFSIGNALED(st)) fprintf(stderr, "  child killed by signal %d\n", WTERMSIG(st));
  char path[PATH_MAX + 32];
  snprintf(path, sizeof path, "%s/flight_rank0.txt", dir);
  FILE *f = fopen(path, "r");
  char line[64] = "";
  EXPECT(f && fgets(line, sizeof line, f) && strncmp(line, "# crun-flight", 13) == 0);
  if (f) fclose(f);
  unlink(path);
  rmdir(dir);
}

/* The flight recorder's wake-up pipe is not inherited by the programs a
 * script starts (os.execute, io.popen): both ends are close-on-exec. */
/* Marks in seen[] the pipe fds this process has open (below 256); counts
 * those not marked before that lack close-on-exec. */
static int new_inheritable_pipes(char *seen, int *fresh) {
  int inherited = 0;
  DIR *d = opendir("/proc/self/fd");
  struct dirent *e;
  while (d && (e = readdir(d)) != NULL) {
    char path[300], to[64] = "";
    int fd = atoi(e->d_name);
    snprintf(path, sizeof path, "/proc/self/fd/%s", e->d_name);
    if (e->d_name[0] == '.' || fd == dirfd(d) || fd >= 256 || readlink(path, to, sizeof to - 1) < 0) continue;
    if (strncmp(to, "pipe:", 5) != 0 || seen[fd]) continue;
    seen[fd] = 1, (*fresh)++;
    if (!(fcntl(fd, F_GETFD) & FD_CLOEXEC)) inherited++;
  }
  if (d) closedir(d);
  return inherited;
}

/* The flight recorder's wake-up pipe is not inherited by the programs a
 * script starts (os.execute, io.popen): both ends are close-on-exec. */
TEST(flight_pipe_cloexec) {
  const char *build = getenv("CRUN_BUILD_DIR");
  EXPECT(build != NULL);
  pid_t pid = fork();
  if (pid == 0) {
    char seen[256] = {0};
    int fresh = 0;
    (void)new_inheritable_pipes(seen, &fresh); /* the test's own (ctest's output pipes) */
    fresh = 0;
    lua_State *L = luaL_newstate();
    luaL_openlibs(L);
    char all[4096];
    snprintf(all, sizeof all, "package.cpath = '%s/lua/?.so'\nrequire('crun.core').flight_arm()",
             build ? build : ".");
    if (luaL_dostring(L, all) != LUA_OK) _exit(3);
    int inherited = new_inheritable_pipes(seen, &fresh);
    _exit(fresh < 2 ? 4 : inherited ? 5 : 0);
  }
  int st = 0;
  EXPECT(pid > 0 && waitpid(pid, &st, 0) == pid);
  if (WIFEXITED(st) && WEXITSTATUS(st) == 4) fprintf(stderr, "  no pipe found after flight_arm\n");
  if (WIFEXITED(st) && WEXITSTATUS(st) == 5) fprintf(stderr, "  a pipe end is inherited across exec\n");
  EXPECT(WIFEXITED(st) && WEXITSTATUS(st) == 0);
}

#define CRUN_TESTS(X) X(sigusr1_after_lua_close) X(flight_pipe_cloexec)
CRUN_TEST_MAIN()
