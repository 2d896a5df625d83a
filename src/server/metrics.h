// Prometheus text exposition (format 0.0.4) of the engine's metrics and the server's responses by
// HTTP status, named like vLLM's (`klinear:` instead of `vllm:`) so existing dashboards adapt.
#pragma once

#include <cstdint>
#include <map>
#include <string>

#include "runtime/metrics.h"

namespace klinear {

std::string prometheus_text(const EngineMetrics& m, const std::map<int, uint64_t>& http_responses);

}  // namespace klinear
