/* fpenv.c — flushing denormal floats to zero (torch.set_flush_denormal).
 * On x86-64 this sets the SSE control register's flush-to-zero (results) and
 * denormals-are-zero (inputs) bits of the calling thread; other threads keep
 * theirs. Off by default, as in torch: results then follow IEEE 754 exactly. */
#include "crun/tensor.h"
#include "tensor/fpenv.h"

#if defined(__x86_64__) || defined(__i386__)
#include <xmmintrin.h>
#define CRUN_MXCSR_FTZ 0x8000u
#define CRUN_MXCSR_DAZ 0x0040u

int crun_set_flush_denormal(int on) {
  unsigned csr = _mm_getcsr();
  csr = on ? (csr | CRUN_MXCSR_FTZ | CRUN_MXCSR_DAZ) : (csr & ~(CRUN_MXCSR_FTZ | CRUN_MXCSR_DAZ));
  _mm_setcsr(csr);
  return 1;
}

unsigned crun__fpenv_flush_begin(void) {
  unsigned csr = _mm_getcsr();
  _mm_setcsr(csr | CRUN_MXCSR_FTZ | CRUN_MXCSR_DAZ);
  return csr;
}

void crun__fpenv_restore(unsigned saved) { _mm_setcsr(saved); }
#else
int crun_set_flush_denormal(int on) { return on ? 0 : 1; }
unsigned crun__fpenv_flush_begin(void) { return 0; }
void crun__fpenv_restore(unsigned saved) { (void)saved; }
#endif
