/* fpenv.h — flushing denormals for a stretch of code (fpenv.c). */
#ifndef CRUN_TENSOR_FPENV_H
#define CRUN_TENSOR_FPENV_H

/* Sets the calling thread's flush-to-zero and denormals-are-zero bits and
 * returns the control word to hand back to crun__fpenv_restore (0 and no
 * effect where the CPU has no such bits). */
unsigned crun__fpenv_flush_begin(void);
void crun__fpenv_restore(unsigned saved);

#endif
