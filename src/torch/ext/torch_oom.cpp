// torch_oom.cpp — optional helper, built only where PyTorch's headers are
// (tests/gpu/build_ext.sh, run by tests/gpu/run_gpu.sh): one function that
// throws c10::OutOfMemoryError, so an OOM inside gpumem_alloc surfaces in
// Python as torch.OutOfMemoryError rather than a plain RuntimeError.
// Not part of the CMake build (that has no torch); gpumem.torch.install()
// loads libgpumem_torch_oom.so when it finds it and registers this function.
#include <c10/util/Exception.h>

extern "C" __attribute__((visibility("default"))) void gpumem_torch_oom_throw(const char *msg) {
    TORCH_CHECK_WITH(OutOfMemoryError, false, msg);
}
