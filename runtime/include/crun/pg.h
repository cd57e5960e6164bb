/* crun/pg.h — process groups, backends, collectives and Work handles.
 * Include <crun.h>. (Filled in by the collectives work.) */
#ifndef CRUN_PG_H
#define CRUN_PG_H

#ifdef __cplusplus
extern "C" {
#endif

#ifdef __cplusplus
}
#endif
#endif /* CRUN_PG_H */
