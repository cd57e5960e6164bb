/* repl.c — the interactive mode of crun-lua (-i).
 *
 * The REPL (rank 0 reads lines, every rank runs them) is a later issue. This
 * file is the one place it plugs in: main.c calls crun__repl_run() for -i. */
#include "launcher.h"

#include <stdio.h>

int crun__repl_run(const crun__opts_t *o) {
  (void)o;
  fprintf(stderr, "crun-lua: -i (interactive mode) is not available yet in crun %s; "
                  "run a script instead: crun-lua -n N script.lua\n", CRUN_VERSION_STRING);
  return 2;
}
