# mpi_lib.sh — what the MPI tests share, sourced after lib.sh: skipped (77)
# without an MPI build or mpirun; mpirun allowed as root, without InfiniBand
# probing, one OpenMP thread a rank; `mpirun` runs the ranks without
# LeakSanitizer (OpenMPI's components, dlopen'd and unloaded by
# MPI_Finalize, leak at exit as "<unknown module>", which no suppression can
# name; frugal's own code is the one process's, leak-checked by the
# single-process runs); `mpi N ARGS...` is mpirun --oversubscribe -np N
# (CI has 2 cores for up to 3 ranks).
if [ "${FR_HAVE_MPI:-0}" != 1 ] || ! command -v mpirun >/dev/null; then
    echo "skipped: frugal built without MPI or no mpirun (install openmpi-bin libopenmpi-dev)"
    exit 77
fi
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1
export OMPI_MCA_btl=self,vader,tcp
mpi_asan=${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0
mpirun() { ASAN_OPTIONS=$mpi_asan command mpirun "$@"; }
mpi() { mpirun --oversubscribe -np "$@"; }
