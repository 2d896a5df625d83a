// The only place a device is chosen.
#include "backend/backend.h"
#include "backend/cpu/backend.h"

namespace klinear {

Result<DeviceKind> parse_device(const std::string& name) {
  if (name == "cpu") return DeviceKind::kCpu;
  if (name == "cuda") return DeviceKind::kCuda;
  return Status::InvalidArgument("device '" + name + "' is not one of: cpu, cuda");
}

Result<std::unique_ptr<Backend>> make_backend(DeviceKind device) {
  switch (device) {
    case DeviceKind::kCpu: return std::unique_ptr<Backend>(std::make_unique<cpu::CpuBackend>());
    case DeviceKind::kCuda:
      return Status::NotSupported("the CUDA backend is not implemented yet in this build; use --device cpu");
  }
  return Status::InvalidArgument("unknown device");
}

}  // namespace klinear
