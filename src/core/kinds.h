// The choices a checkpoint makes and an op computes with, declared once: the config parser
// (io/config.h) fills them and the backend ops (backend/backend.h) take them as they are.
#pragma once

namespace klinear {

enum class Activation { kSilu, kSitu };        // SwiGLU / SiTU-GLU (MODEL.md 3.2)
enum class KdaGate { kSoftplus, kLowerBound };  // MODEL.md 4.3
// Whether the KDA core L2-normalises q and k per head (the model's layers) or takes them as given
// (normalised by the caller, as `klinear kda` and training code pass them). MODEL.md 4.4.
enum class KdaQkNorm { kInside, kGiven };

}  // namespace klinear
