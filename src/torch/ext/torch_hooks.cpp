// torch_hooks.cpp — optional helper built against PyTorch's headers (by
// tests/gpu/build_ext.sh): registers gpumem's record_stream with the current
// torch::cuda::CUDAPluggableAllocator, so that record_stream calls made inside
// torch's C++ (ProcessGroupNCCL, CUDAGuardImpl::recordDataPtrOnStream, ...)
// reach gpumem too, not only Tensor.record_stream from Python (which
// gpumem.torch patches when this helper is absent). Not part of the CMake build.
#include <torch/csrc/cuda/CUDAPluggableAllocator.h>

#include <cstdint>
#include <memory>

typedef int (*gpumem_record_fn)(uint64_t ptr, uint64_t stream);

// Returns 0 on success, -1 if the current allocator is not a pluggable one.
extern "C" __attribute__((visibility("default"))) int gpumem_torch_hook_record_stream(gpumem_record_fn fn) {
    using PA = torch::cuda::CUDAPluggableAllocator::CUDAPluggableAllocator;
    auto cur = torch::cuda::CUDAPluggableAllocator::getCurrentAllocator();
    auto pa = std::dynamic_pointer_cast<PA>(cur);
    if (!pa || !fn) return -1;
    pa->set_record_stream_fn([fn](void *ptr, cudaStream_t stream) {
        fn((uint64_t)(uintptr_t)ptr, (uint64_t)(uintptr_t)stream);
    });
    return 0;
}
