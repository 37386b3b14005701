// Stop requests: what a batch system's signals ask of a running verb, and how the ranks of a job agree on them.
//
// Slurm (and most batch systems) warn a job before its time limit or a preemption with a signal Tessera asks for
// (`--signal=USR1@N`), and end it with SIGTERM, then SIGKILL `KillWait` seconds later. The verbs that run long
// (`train`, `tile`, `infer`) call install_stop_handlers(); the handlers only record the strongest request so far in
// an atomic flag (async-signal-safe: nothing else happens in the handler), and the verbs look at it at their
// natural boundaries:
//
//   SIGUSR1  finish_item  train: stop at the next step boundary and checkpoint; tile: finish the shard in hand;
//                         infer: finish the slide in hand (its outputs and its resume record)
//   SIGTERM  now          train: as SIGUSR1 (a step and a checkpoint take seconds); tile and infer: stop at the next
//                         tile or batch, leaving the unfinished shard or slide to the rerun
//
// and then exit with exit_interrupted (75, "interrupted, resumable: requeue me"; core/error.h), which the job
// scripts in examples/slurm/ turn into a requeue. The rerun (`train --resume auto`; `tile` and `infer` as they are)
// does only what is left.
//
// Many ranks: a signal may reach one rank only (a test's fault injection, `kill` of one process), or reach the
// ranks of a job at different moments (Slurm signals each task separately). agree_stop() is a collective that
// returns the strongest request of any rank, so every rank stops at the same boundary: training steps are in
// lockstep, and a step that stopped on one rank and not on another would deadlock the next exchange. Its cost is
// one 8-byte allreduce (one network latency) per boundary; `train` calls it at every step boundary, where the
// synchronous strategies already wait for every rank, and `infer` at every slide. `tile`'s ranks work alone until
// the end of extraction, and agree there (and after planning).
//
// SIGTERM inside a tile or a slide cannot wait for a boundary every rank reaches together: the rank that sees it
// throws InterruptedError at its next tile or batch, and with many ranks the job ends as a failing rank ends it
// (core::abort_job), with exit_interrupted.
#pragma once

#include <string>

#include "core/comm.h"
#include "core/error.h"

namespace tessera::core {

// What was asked; ordered: a stronger request wins.
enum class StopRequest : int {
  none = 0,
  finish_item = 1,  // SIGUSR1
  now = 2,          // SIGTERM
};

// Installs the handlers of SIGUSR1 and SIGTERM for this process (SA_RESTART: a system call they interrupt goes on).
// Idempotent.
void install_stop_handlers();

// The strongest request this process has received (none when the handlers are not installed).
StopRequest stop_requested() noexcept;

// Collective over `comm`: the strongest request of any rank.
StopRequest agree_stop(const Comm& comm);

// "SIGUSR1", "SIGTERM" or "no signal".
const char* signal_name(StopRequest request) noexcept;

// Throws InterruptedError when SIGTERM was received: the check inside a tile or a batch loop. `where` says what
// is left unfinished ("slide 'a'", "shard-00003.h5").
void throw_if_terminated(const std::string& where);

// Forgets every request (for tests that run a verb twice in one process).
void reset_stop_request() noexcept;

}  // namespace tessera::core
