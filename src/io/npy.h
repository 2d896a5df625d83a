// .npy (NumPy format 1.0) writing and reading for float32 C-order arrays: the output format of
// `klinear logits` and an easy way to compare with Python.
#pragma once

#include <string>

#include "core/status.h"
#include "core/tensor.h"

namespace klinear {

// Writes a host F32 tensor as a little-endian '<f4' C-order array of its shape.
Status write_npy(const std::string& path, const Tensor& t);
// Reads a '<f4' C-order .npy file into a host F32 tensor.
Result<Tensor> read_npy(const std::string& path);

}  // namespace klinear
