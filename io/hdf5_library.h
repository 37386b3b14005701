// The HDF5 library's life in a Tessera process (public: app/main.cpp calls it; the rest of the HDF5 plumbing is
// internal to tessera_io, in io/hdf5.h).
#pragma once

namespace tessera::io {

// Call first in main(), before any HDF5 use. HDF5 registers an atexit handler that closes every id still open;
// after a close that failed (H5Fclose on a full disk cannot flush, and HDF5 1.10 then leaves the file's id
// half torn down) that handler crashes the process with SIGSEGV at exit, turning a reported error into a signal.
// Tessera closes every id itself (RAII handles, io/hdf5.h), before exit, so the handler has nothing to do: this
// turns it off.
void skip_hdf5_exit_cleanup();

}  // namespace tessera::io
