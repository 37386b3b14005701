// Threads: how many cores a process may use, and running one piece of work on several threads.
#pragma once

#include <functional>

namespace tessera::core {

// Ranks of this job on this node, as Open MPI (also under srun) or MPICH/Hydra announce them; 1 otherwise.
// (Not Slurm's allocation-wide SLURM_NTASKS_PER_NODE: a single process in a 4-task allocation is one rank.)
int local_rank_count();

// The cores this process may use: the CPUs of its affinity mask (what the launcher's binding, Slurm's
// --cpus-per-task or a container's cpuset leave it), shared among this job's ranks on this node when they were not
// bound (each then sees the node's every core); at least 1.
int usable_cores();

// Runs work(0) on the calling thread and work(1) .. work(threads − 1) on threads of their own, and returns when all
// have returned. `work` must take its items from a shared counter, so that the others do the share of a thread the
// system cannot start (that thread is left out, and the work still done). When a call throws, the others run to
// their end and the exception of the lowest thread index is rethrown; no thread is left running.
void run_on_threads(int threads, const std::function<void(int thread)>& work);

}  // namespace tessera::core
