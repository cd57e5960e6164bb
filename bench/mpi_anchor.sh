# bench/mpi_anchor.sh — sourced by the benchmark scripts that run Open MPI's
# all_reduce anchor (../shared/anchors/mpi/mpi_allreduce.c): sets MPIRUN,
# copies the anchors to $ANCH once and builds the anchor there when mpicc is
# present (else $ANCH/build/mpi_allreduce stays missing and callers skip it).
# Needs SRC (the source tree) and ANCH set.
MPIRUN="mpirun --allow-run-as-root --oversubscribe --mca btl_tcp_if_include lo --mca oob_tcp_if_include lo"
[ -d "$ANCH" ] || cp -r "$SRC/../shared/anchors" "$ANCH" 2>/dev/null || cp -r /work/shared/anchors "$ANCH"
if [ ! -x "$ANCH/build/mpi_allreduce" ] && command -v mpicc >/dev/null; then
  mkdir -p "$ANCH/build" && mpicc -O2 -march=native -o "$ANCH/build/mpi_allreduce" "$ANCH/mpi/mpi_allreduce.c"
fi
