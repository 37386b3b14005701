// Fault injection: named points in the code where a test makes the process fail, deterministically.
//
// Inert unless the environment variable TESSERA_FAULT is set (it is read once; an unset variable makes every point a
// test of one flag). Tests set it to reproduce a kill, a full disk or a
// failing write at an exact place instead of racing a timer:
//
//   TESSERA_FAULT="<point>[ after=<n>][ times=<n>][ rank=<r>][ do=<action>]"
//
//   point   the name a call site passes to fault::at / fault::error_at, e.g. "train.checkpoint-published"
//   after   fire on the n-th time the point is reached in this process (default 1)
//   times   and on the hits after it, n in all (default 1): a failure that persists, e.g. a file that stays unreadable
//   rank    fire only on this MPI world rank (default: every rank); read from the launcher's environment
//   do      kill   — SIGKILL this process at fault::at (as a killed job, a node failure or a Slurm time limit's
//                    second signal would; nothing after the point runs, no destructor, no atexit)
//           stop   — SIGSTOP this process at the point; it goes on from there when sent SIGCONT. A test holds a rank
//                    still at an exact place (e.g. while it brings the rank's host's link down), polls for the
//                    stopped state ('T' in /proc/PID/stat), acts, and continues it
//           wait   — wait at the point until the process receives SIGUSR1 or SIGTERM (in a verb that installed
//                    core/signals.h's handlers: train, tile, infer), then go on: a test through a batch system holds
//                    the job at an exact place until the system's own signal comes (a time limit's warning)
//           usr1   — raise SIGUSR1 in this process at the point (a batch system's warning before a time limit;
//                    core/signals.h records it and the verb stops at its next boundary); term likewise SIGTERM
//           enospc — fault::error_at returns ENOSPC (the call site then fails as on a full disk); eio likewise
//
// The points (each documented where it is called):
//   train.checkpoint-written   rank 0, after the rolling checkpoint.h5 is published, before the replica sets it
//                              replaced are removed                                      (engine/train_state.cpp)
//   train.replica-written      every rank, after its replica file of a checkpoint is in place, before the checkpoint
//                              naming the set is published                               (engine/train_state.cpp)
//   async-easgd.center-taken   rank 0, after it took the centre to validate and save, the other ranks held
//                                                                                    (engine/strategy_async.cpp)
//   train.step                 every rank, after each optimizer step and its logging       (engine/trainer.cpp)
//   tile.shard-finished        after a shard and its resume record are complete  (preprocessing/tile_job.cpp)
//   import.shard-finished      after a shard and its resume record are complete  (preprocessing/import_job.cpp)
//   infer.slide-finished       the rank writing a slide (rank 0 when its tiles are split over the ranks), after its
//                              outputs and its record are complete                (analysis/infer_outputs.cpp)
//   infer.slide-scored         every rank scoring a slide, after its heatmap is scored (and gathered), before it is
//                              written                                                      (app/infer.cpp)
//   infer.batch                every rank, after each batch of a slide's tiles is scored (engine/slide_inference.cpp)
//   tile.tile                  each tile read into a shard                          (preprocessing/tile_job.cpp)
//   tile.read                  each tile read into a shard, in tile order, of a slide not failed when its batch
//                              began (eio: its read fails, which ends the job unless the tile's slide failed at an
//                              earlier tile)                                        (preprocessing/tile_job.cpp)
//   tile.open                  each slide opened to extract its tiles (eio: the opening fails as an unreadable
//                              file's would)                                        (preprocessing/tile_job.cpp)
//   shard.write                each block of tiles written to a shard (enospc, eio)        (io/shard.cpp)
//   checkpoint.write           each tensor written to a checkpoint (enospc, eio)           (io/checkpoint.cpp)
//   heatmap.write              each dataset written to a heatmap file (enospc, eio)        (io/heatmap.cpp)
//
// Example: TESSERA_FAULT="train.checkpoint-written after=2 rank=0" kills rank 0 right after it published its
// second checkpoint. A malformed TESSERA_FAULT is reported on stderr and ends the process with exit code 2.
#pragma once

#include <string_view>

namespace tessera::core::fault {

// A point where the process may be killed (do=kill), stopped (do=stop), held until a signal (do=wait) or signalled
// (do=usr1|term). Counts the hit;
// returns normally unless a kill fires (a stop returns once the process is continued).
void at(std::string_view point);

// A point where an operation may fail (do=enospc|eio). Counts the hit; returns the errno to simulate when the
// fault fires here, 0 otherwise. A do=kill or do=stop fault on this point kills or stops the process,
// as fault::at does.
int error_at(std::string_view point);

// True when TESSERA_FAULT is set at all (for messages that say a failure was injected).
bool enabled();

}  // namespace tessera::core::fault
