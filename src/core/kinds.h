// The choices a checkpoint makes and an op computes with, declared once: the config parser
// (io/config.h) fills them and the backend ops (backend/backend.h) take them as they are.
#pragma once

namespace klinear {

enum class Activation { kSilu, kSitu };        // SwiGLU / SiTU-GLU (MODEL.md 3.2)
enum class KdaGate { kSoftplus, kLowerBound };  // MODEL.md 4.3

}  // namespace klinear
