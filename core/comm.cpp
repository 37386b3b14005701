#include "core/comm.h"

#include <algorithm>
#include <atomic>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <string_view>
#include <utility>

#include <spdlog/spdlog.h>

#include "core/error.h"
#include "core/world_rank.h"

namespace tessera::core {
namespace {

// MPI counts are int: larger transfers go in chunks of at most this many elements.
constexpr std::size_t max_mpi_count = static_cast<std::size_t>(INT_MAX);

// World rank, remembered at MPI init so that errors and abort_job() can name it even when MPI is down.
std::atomic<int> g_world_rank{0};
// The process runs without MPI (MpiSession(..., false)).
std::atomic<bool> g_alone{false};

// "/home/me/tessera/core/comm.cpp" -> "core/comm.cpp": enough to find the line, short enough to read.
std::string short_path(std::string_view file) {
  auto last = file.rfind('/');
  if (last == std::string_view::npos || last == 0) return std::string(file);
  auto previous = file.rfind('/', last - 1);
  return std::string(previous == std::string_view::npos ? file : file.substr(previous + 1));
}

MPI_Op to_mpi(ReduceOp op) {
  switch (op) {
    case ReduceOp::sum:
      return MPI_SUM;
    case ReduceOp::max:
      return MPI_MAX;
    case ReduceOp::min:
      return MPI_MIN;
  }
  throw InternalError("unknown ReduceOp");
}

int to_int(std::size_t count) { return static_cast<int>(std::min(count, max_mpi_count)); }

// Blocking allreduces go in pieces of at most this many bytes. Measured with Open MPI 4.1 over shared memory
// (2 ranks, 2026-11-23): one 64 MB MPI_Allreduce took 0.376 s (0.18 GB/s), the same data in 4 MB pieces
// 0.033 s (2.05 GB/s), in 16 MB pieces 0.064 s; at 128 MB 1.20 s against 0.072 s. A piece costs one more
// latency (microseconds), nothing next to a large model's exchange.
constexpr std::size_t allreduce_piece_bytes = std::size_t{4} << 20;

template <typename T>
void allreduce_chunked(MPI_Comm comm, T* data, std::size_t count, MPI_Datatype type, ReduceOp op) {
  const std::size_t piece = std::min(max_mpi_count, allreduce_piece_bytes / sizeof(T));
  for (std::size_t done = 0; done < count;) {
    const int n = static_cast<int>(std::min(count - done, piece));
    TESSERA_MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, data + done, n, type, to_mpi(op), comm));
    done += static_cast<std::size_t>(n);
  }
}

void require_active(const char* what) {
  if (!MpiSession::active()) throw InternalError(std::string(what) + ": MPI is not initialized (no MpiSession)");
}

// Variable-size (all)gather of byte strings. Sizes are exchanged first; when the total would overflow the
// int counts and displacements, the data goes in rounds of at most INT_MAX / size bytes per rank.
std::vector<std::string> gather_strings(MPI_Comm comm, int rank, int size, const std::string& mine, int root,
                                        bool all) {
  std::vector<std::uint64_t> sizes(static_cast<std::size_t>(size));
  std::uint64_t my_size = mine.size();
  TESSERA_MPI_CHECK(MPI_Allgather(&my_size, 1, MPI_UINT64_T, sizes.data(), 1, MPI_UINT64_T, comm));

  const bool receives = all || rank == root;
  std::vector<std::string> result(receives ? sizes.size() : 0);
  for (std::size_t i = 0; i < result.size(); ++i) result[i].reserve(sizes[i]);

  const std::uint64_t per_rank = std::max<std::uint64_t>(1, max_mpi_count / static_cast<std::size_t>(size));
  const std::uint64_t largest = *std::max_element(sizes.begin(), sizes.end());
  const std::uint64_t rounds = std::max<std::uint64_t>(1, (largest + per_rank - 1) / per_rank);

  std::vector<int> counts(sizes.size());
  std::vector<int> displs(sizes.size());
  std::string buffer;
  for (std::uint64_t round = 0; round < rounds; ++round) {
    const std::uint64_t offset = round * per_rank;
    std::size_t total = 0;
    for (std::size_t i = 0; i < sizes.size(); ++i) {
      counts[i] = static_cast<int>(sizes[i] > offset ? std::min(per_rank, sizes[i] - offset) : 0);
      displs[i] = static_cast<int>(total);
      total += static_cast<std::size_t>(counts[i]);
    }
    if (receives) buffer.resize(total);
    const char* send = mine.data() + std::min<std::uint64_t>(offset, mine.size());
    const int send_count = counts[static_cast<std::size_t>(rank)];
    if (all) {
      TESSERA_MPI_CHECK(
          MPI_Allgatherv(send, send_count, MPI_BYTE, buffer.data(), counts.data(), displs.data(), MPI_BYTE, comm));
    } else {
      TESSERA_MPI_CHECK(
          MPI_Gatherv(send, send_count, MPI_BYTE, buffer.data(), counts.data(), displs.data(), MPI_BYTE, root, comm));
    }
    for (std::size_t i = 0; i < result.size(); ++i) {
      result[i].append(buffer.data() + displs[i], static_cast<std::size_t>(counts[i]));
    }
  }
  return result;
}

}  // namespace

// This rank in MPI_COMM_WORLD: asked of MPI while it runs (under SimGrid's SMPI every rank is a thread of one
// process, so a remembered value would be whichever rank wrote it last), remembered otherwise.
int current_world_rank() {
  int initialized = 0;
  int finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  int rank = 0;
  if (initialized && !finalized && MPI_Comm_rank(MPI_COMM_WORLD, &rank) == MPI_SUCCESS) return rank;
  return g_world_rank.load();
}

// ---------------------------------------------------------------------------------------------- errors

namespace detail {

// throw_mpi_error (core/comm.h), with `hint` said after the MPI library's reason: what usually makes the call fail
// and what to do.
[[noreturn]] void throw_mpi_error_with_hint(int code, const char* call, const char* file, int line, const char* hint);

void throw_mpi_error(int code, const char* call, const char* file, int line) {
  throw_mpi_error_with_hint(code, call, file, line, nullptr);
}

void throw_mpi_error_with_hint(int code, const char* call, const char* file, int line, const char* hint) {
  std::string reason = "MPI error code " + std::to_string(code);
  int initialized = 0;
  int finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  if (initialized && !finalized) {
    char text[MPI_MAX_ERROR_STRING] = {};
    int length = 0;
    if (MPI_Error_string(code, text, &length) == MPI_SUCCESS) reason.assign(text, static_cast<std::size_t>(length));
  }
  if (hint != nullptr) reason += std::string("; ") + hint;
  InternalError error(std::string(call) + " failed (" + short_path(file) + ":" + std::to_string(line) + "): " + reason);
  error.add_context("rank", static_cast<std::int64_t>(current_world_rank()));
  throw error;
}

}  // namespace detail

// ---------------------------------------------------------------------------------------------- session

MpiSession::MpiSession(int* argc, char*** argv, bool start_mpi) {
  if (!start_mpi) {
    g_alone = true;
    return;
  }
  int initialized = 0;
  TESSERA_MPI_CHECK(MPI_Initialized(&initialized));
  if (initialized) throw InternalError("MpiSession: MPI is already initialized (one MpiSession per process)");

  int provided = MPI_THREAD_SINGLE;
  // SERIALIZED: allreduce's communication thread makes MPI calls while the training thread makes none
  // (engine/strategy.h). Not MULTIPLE: Open MPI's one-sided pt2pt transport, which async-easgd's windows need over
  // TCP, refuses to open a window under MPI_THREAD_MULTIPLE. An MPI that gives less than SERIALIZED still runs:
  // the buckets then progress on the training thread.
  TESSERA_MPI_CHECK(MPI_Init_thread(argc, argv, MPI_THREAD_SERIALIZED, &provided));
  // Errors come back as return codes (turned into InternalError) instead of killing the job silently.
  TESSERA_MPI_CHECK(MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN));
  TESSERA_MPI_CHECK(MPI_Comm_set_errhandler(MPI_COMM_SELF, MPI_ERRORS_RETURN));
  int rank = 0;
  TESSERA_MPI_CHECK(MPI_Comm_rank(MPI_COMM_WORLD, &rank));
  g_world_rank = rank;
  if (provided < MPI_THREAD_FUNNELED) {
    throw InternalError("MPI_Init_thread: the MPI library provides thread level " + std::to_string(provided) +
                        ", Tessera needs MPI_THREAD_FUNNELED (" + std::to_string(MPI_THREAD_FUNNELED) + ")");
  }
}

MpiSession::~MpiSession() = default;

void MpiSession::finalize() {
  if (!active()) return;
  TESSERA_MPI_CHECK(MPI_Finalize());
}

bool MpiSession::active() {
  int initialized = 0;
  int finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  return initialized && !finalized;
}

bool MpiSession::alone() { return g_alone.load(); }

const std::vector<const char*>& launcher_variables() {
  // Open MPI's mpirun, PMIx (srun --mpi=pmix, prterun), PMI-1/2 (srun --mpi=pmi2, MPICH's Hydra), and any srun step.
  // Not SLURM_PROCID: a batch script's own process has SLURM_PROCID=0 but no SLURM_STEP_ID, and Open MPI (its
  // schizo/slurm component) also tells an srun task from a singleton in an allocation by SLURM_STEP_ID alone.
  static const std::vector<const char*> names{
      "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK", "PMI_SIZE", "PMI_FD", "SLURM_STEP_ID"};
  return names;
}

bool started_by_launcher() {
  for (const char* name : launcher_variables()) {
    if (std::getenv(name) != nullptr) return true;
  }
  return false;
}

void abort_job(const std::string& message, int exit_code) {
  std::fprintf(stderr, "tessera: rank %d: %s\n", current_world_rank(), message.c_str());
  std::fflush(stderr);
  if (MpiSession::active()) {
    MPI_Abort(MPI_COMM_WORLD, exit_code);
    std::_Exit(exit_code);  // MPI_Abort does not return; this is for a library that does
  }
  std::exit(exit_code);
}

// ---------------------------------------------------------------------------------------------- Comm

Comm Comm::alone() {
  Comm result(MPI_COMM_NULL, false);
  result.alone_ = true;
  result.rank_ = 0;
  result.size_ = 1;
  return result;
}

Comm::Comm(MPI_Comm comm, bool owned) : comm_(comm), owned_(owned) {
  if (comm_ == MPI_COMM_NULL) {
    owned_ = false;
    rank_ = -1;
    size_ = 0;
    return;
  }
  TESSERA_MPI_CHECK(MPI_Comm_rank(comm_, &rank_));
  TESSERA_MPI_CHECK(MPI_Comm_size(comm_, &size_));
}

MPI_Comm Comm::handle() const {
  if (alone_) throw InternalError("Comm::handle: a world of one rank without MPI (Comm::alone()) has no MPI handle");
  return comm_;
}

Comm Comm::world() {
  if (MpiSession::alone()) return alone();
  require_active("Comm::world");
  return Comm(MPI_COMM_WORLD, false);
}

Comm::Comm(Comm&& other) noexcept
    : comm_(std::exchange(other.comm_, MPI_COMM_NULL)),
      owned_(std::exchange(other.owned_, false)),
      alone_(std::exchange(other.alone_, false)),
      rank_(std::exchange(other.rank_, -1)),
      size_(std::exchange(other.size_, 0)) {}

Comm& Comm::operator=(Comm&& other) noexcept {
  if (this != &other) {
    Comm old(std::move(*this));  // frees the communicator this one owned
    comm_ = std::exchange(other.comm_, MPI_COMM_NULL);
    owned_ = std::exchange(other.owned_, false);
    alone_ = std::exchange(other.alone_, false);
    rank_ = std::exchange(other.rank_, -1);
    size_ = std::exchange(other.size_, 0);
  }
  return *this;
}

Comm::~Comm() {
  // MPI_Comm_free after MPI_Finalize is erroneous; a process that finalized has nothing left to free.
  if (owned_ && comm_ != MPI_COMM_NULL && MpiSession::active()) {
    const detail::MpiCall hold;
    MPI_Comm_free(&comm_);
  }
}

void Comm::barrier() const {
  if (!alone_) TESSERA_MPI_CHECK(MPI_Barrier(comm_));
}

namespace detail {
std::recursive_mutex& mpi_lock() {
  static std::recursive_mutex lock;
  return lock;
}
}  // namespace detail

void Comm::poll() const {
  if (alone_) return;
  int flag = 0;
  TESSERA_MPI_CHECK(MPI_Iprobe(MPI_ANY_SOURCE, MPI_ANY_TAG, comm_, &flag, MPI_STATUS_IGNORE));
}

void Comm::allreduce(float* data, std::size_t count, ReduceOp op) const {
  if (alone_) return;
  allreduce_chunked(comm_, data, count, MPI_FLOAT, op);
}

void Comm::allreduce(double* data, std::size_t count, ReduceOp op) const {
  if (alone_) return;
  allreduce_chunked(comm_, data, count, MPI_DOUBLE, op);
}

void Comm::allreduce(std::int64_t* data, std::size_t count, ReduceOp op) const {
  if (alone_) return;
  allreduce_chunked(comm_, data, count, MPI_INT64_T, op);
}

MPI_Request Comm::iallreduce_sum(float* data, std::size_t count) const {
  if (alone_) return MPI_REQUEST_NULL;
  // One request cannot cover several chunks; 2^31 floats (8 GiB) in one non-blocking call is not a use case.
  if (count > max_mpi_count) {
    throw InternalError("iallreduce_sum: " + std::to_string(count) + " elements exceed one MPI call (max " +
                        std::to_string(max_mpi_count) + ")");
  }
  MPI_Request request = MPI_REQUEST_NULL;
  TESSERA_MPI_CHECK(MPI_Iallreduce(MPI_IN_PLACE, data, static_cast<int>(count), MPI_FLOAT, MPI_SUM, comm_, &request));
  return request;
}

void Comm::wait(MPI_Request& request) {
  if (request != MPI_REQUEST_NULL) TESSERA_MPI_CHECK(MPI_Wait(&request, MPI_STATUS_IGNORE));
}

bool Comm::test(MPI_Request& request) {
  if (request == MPI_REQUEST_NULL) return true;
  int done = 0;
  TESSERA_MPI_CHECK(MPI_Test(&request, &done, MPI_STATUS_IGNORE));
  return done != 0;
}

// A Comm::alone()'s collectives take root 0 only, as MPI would reject another.
void Comm::check_alone_root(const char* call, int root) {
  if (root != 0) {
    throw InternalError(std::string("Comm::") + call + ": root " + std::to_string(root) +
                        " in a world of one rank (Comm::alone())");
  }
}

void Comm::broadcast(void* data, std::size_t bytes, int root) const {
  if (alone_) return check_alone_root("broadcast", root);
  // At least one call, even for zero bytes, so that every rank takes part and a bad root is reported.
  std::size_t done = 0;
  do {
    int n = to_int(bytes - done);
    TESSERA_MPI_CHECK(MPI_Bcast(static_cast<char*>(data) + done, n, MPI_BYTE, root, comm_));
    done += static_cast<std::size_t>(n);
  } while (done < bytes);
}

void Comm::broadcast(std::string& text, int root) const {
  std::uint64_t n = text.size();
  broadcast(&n, sizeof n, root);
  text.resize(n);
  // Every rank knows n now: an empty text needs no second call (SimGrid's SMPI 3.32 divides by zero in its
  // pipelined broadcast of 0 bytes).
  if (n > 0) broadcast(text.data(), n, root);
}

std::vector<std::string> Comm::gather_bytes(const std::string& mine, int root) const {
  if (alone_) {
    check_alone_root("gather_bytes", root);
    return {mine};
  }
  return gather_strings(comm_, rank_, size_, mine, root, false);
}

std::vector<std::string> Comm::allgather_bytes(const std::string& mine) const {
  if (alone_) return {mine};
  return gather_strings(comm_, rank_, size_, mine, 0, true);
}

Comm Comm::split_node() const {
  if (alone_) return alone();
  int world_rank = 0;
  TESSERA_MPI_CHECK(MPI_Comm_rank(MPI_COMM_WORLD, &world_rank));
  MPI_Comm node = MPI_COMM_NULL;
  TESSERA_MPI_CHECK(MPI_Comm_split_type(comm_, MPI_COMM_TYPE_SHARED, world_rank, MPI_INFO_NULL, &node));
  Comm result(node, true);
  if (node != MPI_COMM_NULL) TESSERA_MPI_CHECK(MPI_Comm_set_errhandler(node, MPI_ERRORS_RETURN));
  return result;
}

Comm Comm::split(int color, int key) const {
  if (alone_) return color == MPI_UNDEFINED ? Comm(MPI_COMM_NULL, false) : alone();
  MPI_Comm part = MPI_COMM_NULL;
  TESSERA_MPI_CHECK(MPI_Comm_split(comm_, color, key, &part));
  Comm result(part, true);
  if (part != MPI_COMM_NULL) TESSERA_MPI_CHECK(MPI_Comm_set_errhandler(part, MPI_ERRORS_RETURN));
  return result;
}

// ---------------------------------------------------------------------------------------------- Window

Window::Window(const Comm& comm, std::size_t bytes, int disp_unit, Kind kind)
    : bytes_(bytes),
      rank_(comm.rank()),
      disp_unit_(disp_unit > 0 ? disp_unit : 1),
      kind_(kind),
      uncaught_at_creation_(std::uncaught_exceptions()) {
  if (comm.is_alone()) {
    alone_memory_ = std::make_unique<std::byte[]>(std::max<std::size_t>(1, bytes));  // zeroed; new[]'s alignment
    base_ = bytes == 0 ? nullptr : alone_memory_.get();
    return;
  }
  const detail::MpiCall hold;  // the calls below that do not go through TESSERA_MPI_CHECK take turns too
  const auto size = static_cast<MPI_Aint>(bytes);
  if (kind == Kind::shared) {
    if (const int code = MPI_Win_allocate_shared(size, disp_unit, MPI_INFO_NULL, comm.handle(), &base_, &win_);
        code != MPI_SUCCESS) {
      detail::throw_mpi_error_with_hint(code, "MPI_Win_allocate_shared", __FILE__, __LINE__,
                                        "shared-memory windows (two-level) need Open MPI's osc sm: if mpirun's --mca "
                                        "osc leaves it out, add it (--mca osc sm,pt2pt)");
    }
  } else if (const int code = MPI_Win_allocate(size, disp_unit, MPI_INFO_NULL, comm.handle(), &base_, &win_);
             code != MPI_SUCCESS) {
    // Seen across hosts over TCP with Open MPI 4.1: its default one-sided component needs an RDMA network.
    detail::throw_mpi_error_with_hint(
        code, "MPI_Win_allocate", __FILE__, __LINE__,
        "one-sided windows (async-easgd) across nodes need an RDMA network, or with Open MPI over "
        "TCP: mpirun --mca osc sm,pt2pt");
  }
  // Windows do not inherit the communicator's error handler.
  TESSERA_MPI_CHECK(MPI_Win_set_errhandler(win_, MPI_ERRORS_RETURN));
  if (bytes == 0) base_ = nullptr;  // MPI may hand out a dummy address for an empty segment
}

Window::~Window() {
  if (win_ == MPI_WIN_NULL || !MpiSession::active()) return;
  // MPI_Win_free synchronizes with the other ranks; while unwinding they may never arrive, so the window is
  // left to the abort that follows.
  if (std::uncaught_exceptions() > uncaught_at_creation_) return;
  const detail::MpiCall hold;
  MPI_Win_free(&win_);
}

void* Window::at(int rank, std::size_t offset, std::size_t bytes) const {
  const auto unit = static_cast<std::size_t>(disp_unit_);
  // The offset is compared before it is multiplied, so that offset * unit cannot wrap into the window.
  if (rank != 0 || offset > bytes_ / unit || bytes > bytes_ - offset * unit) {
    throw InternalError("Window: " + std::to_string(bytes) + " bytes at offset " + std::to_string(offset) +
                        " of rank " + std::to_string(rank) + " lie outside a window of one rank and " +
                        std::to_string(bytes_) + " bytes");
  }
  return static_cast<char*>(base_) + offset * unit;
}

void* Window::shared_pointer(int rank, std::size_t* bytes) const {
  if (kind_ != Kind::shared) throw InternalError("Window::shared_pointer: not a shared-memory window");
  if (alone_memory_) {
    at(rank, 0, 0);  // rank 0 only
    if (bytes) *bytes = bytes_;
    return base_;
  }
  MPI_Aint size = 0;
  int disp_unit = 0;
  void* pointer = nullptr;
  TESSERA_MPI_CHECK(MPI_Win_shared_query(win_, rank, &size, &disp_unit, &pointer));
  if (bytes) *bytes = static_cast<std::size_t>(size);
  return size == 0 ? nullptr : pointer;
}

MPI_Win Window::handle() const {
  if (alone_memory_) throw InternalError("Window::handle: a window on a Comm::alone() has no MPI handle");
  return win_;
}

// Epochs on a window of a Comm::alone() do nothing (on rank 0, the only one): every transfer completes in the call.
void Window::lock(int rank, bool exclusive) const {
  if (alone_memory_) return static_cast<void>(at(rank, 0, 0));
  TESSERA_MPI_CHECK(MPI_Win_lock(exclusive ? MPI_LOCK_EXCLUSIVE : MPI_LOCK_SHARED, rank, 0, win_));
}

void Window::unlock(int rank) const {
  if (alone_memory_) return static_cast<void>(at(rank, 0, 0));
  TESSERA_MPI_CHECK(MPI_Win_unlock(rank, win_));
}

void Window::lock_all() const {
  if (!alone_memory_) TESSERA_MPI_CHECK(MPI_Win_lock_all(0, win_));
}

void Window::unlock_all() const {
  if (!alone_memory_) TESSERA_MPI_CHECK(MPI_Win_unlock_all(win_));
}

void Window::flush(int rank) const {
  if (alone_memory_) return static_cast<void>(at(rank, 0, 0));
  TESSERA_MPI_CHECK(MPI_Win_flush(rank, win_));
}

void Window::sync() const {
  if (!alone_memory_) TESSERA_MPI_CHECK(MPI_Win_sync(win_));
}

void Window::fence() const {
  if (!alone_memory_) TESSERA_MPI_CHECK(MPI_Win_fence(0, win_));
}

namespace {

// Splits a transfer of `count` elements of `element_bytes` into int-sized calls whose byte length is a
// multiple of the window's disp_unit, so that every chunk starts at a whole target displacement.
template <typename Call>
void for_each_chunk(int disp_unit, std::size_t count, std::size_t element_bytes, std::size_t offset, Call&& call) {
  const auto unit = static_cast<std::size_t>(disp_unit);
  const std::size_t chunk = std::max<std::size_t>(1, (max_mpi_count / unit) * unit);
  for (std::size_t done = 0; done < count;) {
    const std::size_t n = std::min(chunk, count - done);
    const auto disp = static_cast<MPI_Aint>(offset + done * element_bytes / unit);
    call(done, static_cast<int>(n), disp);
    done += n;
  }
}

// Adds `count` elements of `data` into the window's memory at `to` (a window of a Comm::alone()), atomically against
// the process's other accumulates as MPI_Accumulate is.
template <typename T>
void add_into(void* to, const T* data, std::size_t count) {
  if (count == 0) return;  // `to` may be a zero-byte window's null base
  const detail::MpiCall hold;
  std::vector<T> sum(count);
  std::memcpy(sum.data(), to, count * sizeof(T));
  for (std::size_t i = 0; i < count; ++i) sum[i] += data[i];
  std::memcpy(to, sum.data(), count * sizeof(T));
}

}  // namespace

void Window::put(const void* data, std::size_t bytes, int rank, std::size_t offset) const {
  if (alone_memory_) {
    if (bytes > 0) std::memcpy(at(rank, offset, bytes), data, bytes);
    return;
  }
  for_each_chunk(disp_unit_, bytes, 1, offset, [&](std::size_t done, int n, MPI_Aint disp) {
    TESSERA_MPI_CHECK(MPI_Put(static_cast<const char*>(data) + done, n, MPI_BYTE, rank, disp, n, MPI_BYTE, win_));
  });
}

void Window::get(void* data, std::size_t bytes, int rank, std::size_t offset) const {
  if (alone_memory_) {
    if (bytes > 0) std::memcpy(data, at(rank, offset, bytes), bytes);
    return;
  }
  for_each_chunk(disp_unit_, bytes, 1, offset, [&](std::size_t done, int n, MPI_Aint disp) {
    TESSERA_MPI_CHECK(MPI_Get(static_cast<char*>(data) + done, n, MPI_BYTE, rank, disp, n, MPI_BYTE, win_));
  });
}

void Window::accumulate_sum(const float* data, std::size_t count, int rank, std::size_t offset) const {
  if (alone_memory_) {
    add_into(at(rank, offset, count * sizeof(float)), data, count);
    return;
  }
  for_each_chunk(disp_unit_, count, sizeof(float), offset, [&](std::size_t done, int n, MPI_Aint disp) {
    TESSERA_MPI_CHECK(MPI_Accumulate(data + done, n, MPI_FLOAT, rank, disp, n, MPI_FLOAT, MPI_SUM, win_));
  });
}

void Window::accumulate_sum(const std::int64_t* data, std::size_t count, int rank, std::size_t offset) const {
  if (alone_memory_) {
    add_into(at(rank, offset, count * sizeof(std::int64_t)), data, count);
    return;
  }
  for_each_chunk(disp_unit_, count, sizeof(std::int64_t), offset, [&](std::size_t done, int n, MPI_Aint disp) {
    TESSERA_MPI_CHECK(MPI_Accumulate(data + done, n, MPI_INT64_T, rank, disp, n, MPI_INT64_T, MPI_SUM, win_));
  });
}

std::int64_t Window::fetch_add(std::int64_t value, int rank, std::size_t offset) const {
  std::int64_t previous = 0;
  if (alone_memory_) {
    const detail::MpiCall hold;  // atomic against the process's other accumulates, as MPI_Fetch_and_op is
    void* to = at(rank, offset, sizeof previous);
    std::memcpy(&previous, to, sizeof previous);
    add_into(to, &value, 1);
    return previous;
  }
  TESSERA_MPI_CHECK(
      MPI_Fetch_and_op(&value, &previous, MPI_INT64_T, rank, static_cast<MPI_Aint>(offset), MPI_SUM, win_));
  TESSERA_MPI_CHECK(MPI_Win_flush(rank, win_));  // `previous` is only defined once the operation completed
  return previous;
}

}  // namespace tessera::core

namespace tessera::core {

ProgressThread::ProgressThread(const Comm& comm, std::chrono::microseconds period) {
  if (comm.is_alone()) return;  // nothing to progress
  int level = MPI_THREAD_SINGLE;
  TESSERA_MPI_CHECK(MPI_Query_thread(&level));
  if (level < MPI_THREAD_SERIALIZED) {
    spdlog::warn(
        "MPI offers thread level {} (below MPI_THREAD_SERIALIZED): no progress thread; one-sided "
        "requests to this rank wait for its own MPI calls",
        level);
    return;
  }
  thread_ = std::thread([this, &comm, period] {
    try {
      std::unique_lock<std::mutex> lock(mutex_);
      while (!stop_) {
        lock.unlock();
        comm.poll();
        lock.lock();
        wake_.wait_for(lock, period, [this] { return stop_; });
      }
    } catch (const std::exception& e) {  // an MPI failure in a poll: nothing on this thread can recover from it
      abort_job(std::string("MPI progress thread: ") + e.what(), exit_code_for(ErrorKind::internal));
    }
  });
}

ProgressThread::~ProgressThread() {
  if (!thread_.joinable()) return;
  {
    const std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  wake_.notify_one();
  thread_.join();
}

}  // namespace tessera::core
