// gpumem_torch_entry.cpp — the two functions PyTorch's CUDAPluggableAllocator
// calls. They are C++ only so that a failed allocation can throw: torch does
// not check alloc's return value (a NULL pointer faults in the next kernel),
// but an exception thrown here reaches Python as an exception and the process
// keeps working. The exception is std::runtime_error (RuntimeError in
// Python); gpumem.torch.oom_guard() turns an OOM into torch.OutOfMemoryError.
// This is the fallback path: the C++ shim (python/csrc) raises
// torch.OutOfMemoryError itself.
#include "gpumem_torch.h"

#include "gpumem/gpumem.h"

#include <stdexcept>
#include <string>
#include <sys/types.h>

typedef struct CUstream_st *cudaStream_t;

extern "C" GPUMEM_TORCH_API void *gpumem_alloc(ssize_t size, int device, cudaStream_t stream) {
    uint64_t p = 0;
    int st = gpumem_torch_alloc_raw((int64_t)size, device, (uint64_t)(uintptr_t)stream, &p);
    if (st == 0) return (void *)(uintptr_t)p;
    std::string msg = gpumem_torch_last_error();
    if (msg.empty()) msg = "gpumem: allocation failed";
    throw std::runtime_error(msg);
}

// Must not throw: torch frees from destructors. A failure is counted and its
// message kept in gpumem_torch_last_error() for the Python side.
extern "C" GPUMEM_TORCH_API void gpumem_free(void *ptr, size_t size, int device, cudaStream_t stream) {
    (void)size;
    (void)device;
    (void)stream;
    if (gpumem_torch_free_raw((uint64_t)(uintptr_t)ptr) != 0) gpumem__torch_note_failed_free();
}
