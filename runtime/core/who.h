/* who.h — how an error text names a rank of a group (core/status.c). */
#ifndef CRUN_CORE_WHO_H
#define CRUN_CORE_WHO_H

/* "rank G", G the global rank of group rank r (global[r]; what
 * dist.get_rank() returns and crun-lua's "[rank G]" prefix shows), then
 * " (group rank r)" when G is not r (a sub-group), so that one text is read
 * one way on every rank. global NULL, or r outside 0..n-1: r is G. Use the
 * .s of the result as a "%s" argument: the array lives until the end of the
 * full expression (C11 temporary lifetime). */
typedef struct { char s[48]; } crun__who_t;
crun__who_t crun__who(const int *global, int n, int r);

#endif
