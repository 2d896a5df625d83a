// Prometheus text exposition (format 0.0.4) of the engine's metrics and the server's responses by
// HTTP status: klinear's series (`klinear:`), and the ones vLLM exports too again under vLLM's
// names with its `model_name` label (`vllm:num_requests_running{model_name="..."}`, ...), so
// existing vLLM dashboards work unchanged.
#pragma once

#include <cstdint>
#include <map>
#include <string>

#include "runtime/metrics.h"

namespace klinear {

std::string prometheus_text(const EngineMetrics& m, const std::map<int, uint64_t>& http_responses,
                            const std::string& model_name);

}  // namespace klinear
