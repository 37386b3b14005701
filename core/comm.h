// The MPI communicator facade. Everything in Tessera that talks between processes goes through here.
//
// - A program started without mpirun/srun runs as a single rank (MPI singleton): every collective is valid.
//   A verb that needs no MPI on its own (main.cpp: `tile`) starts no MPI at all then (MpiSession(..., false)): its
//   Comm::world() is a world of one rank whose collectives copy locally and whose windows are local memory (why:
//   README, "Running on many processes").
// - Every MPI call is checked (TESSERA_MPI_CHECK with file and line). MPI errors on communicators and
//   windows are returned rather than fatal, turned into InternalError naming the call and the rank, and
//   `main` calls abort_job(), which prints one message naming the rank and takes all ranks down.
// - MPI is finalized explicitly by MpiSession::finalize() on the success path, never from a destructor
//   that may run during stack unwinding.
#pragma once

// C API only: tessera_io defines OMPI_SKIP_MPICXX for every includer (io/CMakeLists.txt).
#include <mpi.h>

#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <ratio>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

// Checks the return code of an MPI call: on failure throws InternalError naming the call text, file:line,
// the MPI error string and the world rank. For raw MPI calls outside the facade, on handles whose error
// handler is MPI_ERRORS_RETURN (MPI_COMM_WORLD and everything the facade creates). The call runs holding the
// process's MPI lock (detail::MpiCall), so that a ProgressThread never calls MPI at the same time.
#define TESSERA_MPI_CHECK(call)                                            \
  do {                                                                     \
    const ::tessera::core::detail::MpiCall tessera_mpi_call_;              \
    ::tessera::core::detail::check_mpi((call), #call, __FILE__, __LINE__); \
  } while (false)

namespace tessera::core {

namespace detail {
[[noreturn]] void throw_mpi_error(int code, const char* call, const char* file, int line);
inline void check_mpi(int code, const char* call, const char* file, int line) {
  if (code != MPI_SUCCESS) throw_mpi_error(code, call, file, line);
}
// The process's MPI lock, held for the length of one MPI call (TESSERA_MPI_CHECK). MPI_THREAD_SERIALIZED allows
// any thread to call MPI, one at a time; the lock makes that so when a ProgressThread polls beside the thread
// that works. Recursive: reporting a failed call may make MPI calls of its own.
std::recursive_mutex& mpi_lock();
struct MpiCall {
  MpiCall() { mpi_lock().lock(); }
  ~MpiCall() { mpi_lock().unlock(); }
  MpiCall(const MpiCall&) = delete;
  MpiCall& operator=(const MpiCall&) = delete;
};
}  // namespace detail

// Initializes MPI for the life of main(). Threading level: MPI_THREAD_SERIALIZED (the main thread calls MPI, and
// allreduce's communication thread while the main thread does not, and a ProgressThread taking turns with it through
// detail::MpiCall; loader threads never do). Needs FUNNELED.
// `start_mpi` false: MPI is not initialized, and the process is a world of one rank on its own (alone()).
class MpiSession {
 public:
  MpiSession(int* argc, char*** argv, bool start_mpi = true);
  ~MpiSession();  // does NOT finalize; if finalize() was not called the process is going down anyway
  MpiSession(const MpiSession&) = delete;
  MpiSession& operator=(const MpiSession&) = delete;

  void finalize();       // collective; call once at the end of a successful run
  static bool active();  // MPI initialized and not finalized
  static bool alone();   // the process runs without MPI (start_mpi false)
};

// Whether a launcher (mpirun, srun, mpiexec) started this process: one of launcher_variables(), which Open MPI, PMIx,
// PMI or srun set for the processes they start, is in the environment.
bool started_by_launcher();
const std::vector<const char*>& launcher_variables();

// Aborts every rank of the job with `exit_code` after printing "rank R: message" to stderr.
// Safe to call whether or not MPI is initialized.
[[noreturn]] void abort_job(const std::string& message, int exit_code);

enum class ReduceOp { sum, max, min };

// MPI's wall clock (MPI_Wtime) as a std::chrono clock. Code that times communication uses it rather than
// steady_clock, so that under SimGrid's SMPI (sim/), where the network is simulated, it reads simulated time;
// with a real MPI it is an ordinary monotonic wall clock. Valid while MPI is initialized: never in a process that
// runs without MPI (MpiSession::alone()).
struct MpiClock {
  using rep = double;
  using period = std::ratio<1>;
  using duration = std::chrono::duration<double>;
  using time_point = std::chrono::time_point<MpiClock>;
  static constexpr bool is_steady = true;
  static time_point now() { return time_point(duration(MPI_Wtime())); }
};

class Comm {
 public:
  // MPI_COMM_WORLD (a non-owning handle); alone() when the process runs without MPI (MpiSession::alone()).
  static Comm world();
  // A world of one rank that makes no MPI call: barrier and poll do nothing, reductions and broadcasts leave the data
  // as it is, gathers return this rank's part, splits give another such world (an empty Comm for MPI_UNDEFINED),
  // windows on it are local memory, and iallreduce_sum returns MPI_REQUEST_NULL. Valid with or without MPI.
  static Comm alone();
  bool is_alone() const { return alone_; }

  int rank() const { return rank_; }
  int size() const { return size_; }
  bool is_root() const { return rank_ == 0; }
  MPI_Comm handle() const;  // throws InternalError on an alone() Comm, which has none

  void barrier() const;
  // Lets MPI make progress (one MPI_Iprobe; it receives nothing). A rank that computes for long and holds a window
  // other ranks operate on calls it now and then: over transports where the target's MPI serves one-sided operations
  // (Open MPI's osc/pt2pt, used over TCP), an operation aimed at a rank that never enters MPI waits until it does.
  // Where the network or shared memory serves them (osc/sm, RDMA) it costs a function call.
  void poll() const;

  // In-place allreduce over `count` elements, in pieces of at most 4 MB (core/comm.cpp: large single messages are
  // an order of magnitude slower per byte with Open MPI's shared-memory transport).
  void allreduce(float* data, std::size_t count, ReduceOp op) const;
  void allreduce(double* data, std::size_t count, ReduceOp op) const;
  void allreduce(std::int64_t* data, std::size_t count, ReduceOp op) const;
  template <typename T>
  T allreduce_value(T value, ReduceOp op) const {
    allreduce(&value, 1, op);
    return value;
  }
  // Non-blocking in-place allreduce (sum) for overlapping communication with compute.
  MPI_Request iallreduce_sum(float* data, std::size_t count) const;
  static void wait(MPI_Request& request);
  // True when `request` has completed (it is then MPI_REQUEST_NULL); lets MPI progress non-blocking collectives.
  // MPI_REQUEST_NULL (an alone() Comm's) is complete without asking MPI.
  static bool test(MPI_Request& request);

  // Broadcast from `root`; vectors and strings are resized on the receivers.
  void broadcast(void* data, std::size_t bytes, int root) const;
  void broadcast(std::string& text, int root) const;
  template <typename T>
  void broadcast(std::vector<T>& values, int root) const {
    static_assert(std::is_trivially_copyable_v<T>, "broadcast sends raw bytes");
    std::uint64_t n = values.size();
    broadcast(&n, sizeof n, root);
    values.resize(n);
    if (n > 0) broadcast(values.data(), n * sizeof(T), root);  // as broadcast(std::string&): see core/comm.cpp
  }

  // Variable-size gather of raw bytes to `root`: on root, one entry per rank (rank order); elsewhere empty.
  std::vector<std::string> gather_bytes(const std::string& mine, int root) const;
  // Variable-size allgather: every rank gets one entry per rank.
  std::vector<std::string> allgather_bytes(const std::string& mine) const;

  // Ranks that share memory (same node), keyed by world rank. Owns the new communicator.
  Comm split_node() const;
  // General split; ranks with the same color land in one communicator, ordered by key. A rank passing
  // color MPI_UNDEFINED gets an empty Comm (handle() == MPI_COMM_NULL, size() == 0).
  Comm split(int color, int key) const;

  Comm(const Comm&) = delete;
  Comm& operator=(const Comm&) = delete;
  Comm(Comm&& other) noexcept;
  Comm& operator=(Comm&& other) noexcept;
  ~Comm();

 private:
  Comm(MPI_Comm comm, bool owned);
  static void check_alone_root(const char* call, int root);
  MPI_Comm comm_ = MPI_COMM_NULL;
  bool owned_ = false;
  bool alone_ = false;
  int rank_ = 0;
  int size_ = 1;
};

// An MPI one-sided window (RAII: freed in the destructor, which is collective, so destroy windows in the
// same order on every rank). Each rank exposes `bytes` of its own memory (0 is fine). Creation is
// collective. A window destroyed during stack unwinding is not freed (MPI_Win_free synchronizes, and the
// other ranks may never get there): the failing rank is expected to abort_job(). On a Comm::alone() the window is
// this process's memory (zeroed): epochs do nothing and transfers aimed at rank 0 copy or add in place.
class Window {
 public:
  enum class Kind { allocate, shared };  // shared: MPI_Win_allocate_shared, comm must be node-local

  Window(const Comm& comm, std::size_t bytes, int disp_unit, Kind kind = Kind::allocate);
  ~Window();
  Window(const Window&) = delete;
  Window& operator=(const Window&) = delete;

  void* local() const { return base_; }
  std::size_t local_bytes() const { return bytes_; }
  // Shared windows only: direct pointer to `rank`'s segment (and its size in bytes).
  void* shared_pointer(int rank, std::size_t* bytes = nullptr) const;

  // Passive-target epochs.
  void lock(int rank, bool exclusive) const;
  void unlock(int rank) const;
  void lock_all() const;
  void unlock_all() const;
  void flush(int rank) const;
  void sync() const;  // MPI_Win_sync: memory barrier between public and private copies
  // Active-target epoch boundary.
  void fence() const;

  // Transfers inside an epoch. `offset` is in units of the window's disp_unit.
  void put(const void* data, std::size_t bytes, int rank, std::size_t offset) const;
  void get(void* data, std::size_t bytes, int rank, std::size_t offset) const;
  void accumulate_sum(const float* data, std::size_t count, int rank, std::size_t offset) const;
  void accumulate_sum(const std::int64_t* data, std::size_t count, int rank, std::size_t offset) const;
  // Atomic fetch-and-add of one int64 at `offset`; returns the previous value. Flushes `rank` to get the
  // value, so call it inside a passive-target epoch (lock/lock_all), not between fences.
  std::int64_t fetch_add(std::int64_t value, int rank, std::size_t offset) const;

  MPI_Win handle() const;  // throws InternalError on a window of a Comm::alone(), which has none

 private:
  // A window on a Comm::alone(): its memory (win_ is then MPI_WIN_NULL), and where `bytes` at `offset` lie in it.
  void* at(int rank, std::size_t offset, std::size_t bytes) const;
  std::unique_ptr<std::byte[]> alone_memory_;
  MPI_Win win_ = MPI_WIN_NULL;
  void* base_ = nullptr;
  std::size_t bytes_ = 0;
  int rank_ = 0;
  int disp_unit_ = 1;
  Kind kind_ = Kind::allocate;
  int uncaught_at_creation_ = 0;  // std::uncaught_exceptions() when created: detects unwinding in ~Window
};

// While alive, a thread of its own lets MPI progress (Comm::poll on `comm` every `period`), so that one-sided
// operations aimed at this rank complete while the rank computes: where the target's MPI serves them (Open MPI's
// osc/pt2pt, used over TCP) they would otherwise wait until the rank's next MPI call. Its polls and the other
// threads' MPI calls take turns (detail::MpiCall). Under an MPI that offers less than MPI_THREAD_SERIALIZED no
// thread is started (running() is false) and the rank progresses only in its own MPI calls; nor on a Comm::alone().
class ProgressThread {
 public:
  // `comm` must outlive the thread.
  explicit ProgressThread(const Comm& comm, std::chrono::microseconds period = std::chrono::milliseconds(1));
  ~ProgressThread();  // stops the thread and waits for it
  ProgressThread(const ProgressThread&) = delete;
  ProgressThread& operator=(const ProgressThread&) = delete;

  bool running() const { return thread_.joinable(); }

 private:
  std::mutex mutex_;
  std::condition_variable wake_;
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace tessera::core
