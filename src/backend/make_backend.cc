// The only place a device is chosen.
#include "backend/backend.h"
#include "backend/cpu/backend.h"
#ifdef KLINEAR_WITH_CUDA
#include "backend/cuda/backend.h"
#include "dist/nccl_comm.h"
#endif

namespace klinear {

Result<Device> parse_device(const std::string& name) {
  if (name == "cpu") return Device::kCpu;
  if (name == "cuda") return Device::kCuda;
  return Status::InvalidArgument("device '" + name + "' is not one of: cpu, cuda");
}

Result<DType> parse_compute_dtype(const std::string& name, Device device) {
  if (name.empty()) return device == Device::kCuda ? DType::kBF16 : DType::kF32;
  if (name == "float32") return DType::kF32;
  if (name == "bfloat16") return DType::kBF16;
  return Status::InvalidArgument("dtype '" + name + "' is not one of: float32, bfloat16");
}

Result<CudaGraphs> parse_cuda_graphs(const std::string& name) {
  if (name == "on") return CudaGraphs::kOn;
  if (name == "off") return CudaGraphs::kOff;
  return Status::InvalidArgument("CUDA graphs '" + name + "' is not one of: on, off");
}

Result<AttentionKernels> parse_attention_kernels(const std::string& name) {
  if (name == "best") return AttentionKernels::kBest;
  if (name == "own") return AttentionKernels::kOwn;
  return Status::InvalidArgument("attention kernels '" + name + "' is not one of: best, own");
}

Result<std::unique_ptr<Backend>> make_backend(const BackendOptions& o) {
  switch (o.device) {
    case Device::kCpu:
      if (o.dtype != DType::kF32)
        return Status::NotSupported(std::string("the CPU backend computes in float32 only, not ") + dtype_name(o.dtype));
      return std::unique_ptr<Backend>(std::make_unique<cpu::CpuBackend>(o.batch_invariance));
    case Device::kCuda: {
      if (o.batch_invariance == BatchInvariance::kOn)
        return Status::NotSupported("--batch-invariant on CUDA: its batch-invariant kernels are not built yet "
                                    "(issue 40); the CPU backend has the mode (--device cpu)");
#ifdef KLINEAR_WITH_CUDA
      auto be = cuda::CudaBackend::create(o.dtype, o.graphs, o.attention, o.gpu);
      if (!be.ok()) return be.status();
      return std::unique_ptr<Backend>(std::move(be).value());
#else
      return Status::NotSupported("this klinear was built without CUDA (configure with -DKLINEAR_CUDA=ON); use --device cpu");
#endif
    }
  }
  return Status::InvalidArgument("unknown device");
}

Result<std::unique_ptr<Comm>> make_backend_comm(Backend& backend, Comm& host_world) {
  switch (backend.device()) {
    case Device::kCpu:
      return host_world.split(SplitArgs{0, host_world.rank()});
    case Device::kCuda:
#ifdef KLINEAR_WITH_CUDA
      return open_gpu_world(host_world, static_cast<cuda::CudaBackend&>(backend).stream());
#else
      break;
#endif
  }
  return Status::NotSupported(std::string("ranks on the ") + backend.name() + " backend");
}

}  // namespace klinear
