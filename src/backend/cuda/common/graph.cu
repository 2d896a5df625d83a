// CUDA graphs of steps (backend.h, run_graph): per key, one eager run, then one capture of the
// stream in global mode (any other thread's unsafe CUDA call fails rather than corrupts it; device
// blocks let go of meanwhile are freed after it, device.cuh), then replays. Ops that cannot be
// captured check breaks_capture() first and skip their work, so a body that uses one fails here
// with the op's name, not with an invalidated capture deep in CUDA.
#include <string>

#include "backend/cuda/common/device.cuh"

namespace klinear::cuda {

struct CudaBackend::Graph {
  int runs = 0;  // calls so far: 1 = ran eagerly, 2+ = captured
  cudaGraphExec_t exec = nullptr;
  ~Graph() {
    if (exec) cudaGraphExecDestroy(exec);
  }
};

bool CudaBackend::breaks_capture(const std::string& what) {
  if (!capturing_) return false;
  if (capture_breaker_.empty()) capture_breaker_ = what;
  return true;
}

Status CudaBackend::run_graph(int64_t key, const std::function<void()>& body) {
  if (graphs_ == CudaGraphs::kOff) {
    body();
    return Status();
  }
  std::shared_ptr<Graph>& g = graph_by_key_[key];
  if (!g) g = std::make_shared<Graph>();
  if (g->runs++ == 0) {
    body();
    return Status();
  }
  if (!g->exec) {
    const std::string what = "graph " + std::to_string(key) + " capture";
    hold_block_frees();
    KL_CUDA(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeGlobal), what);
    capturing_ = true;
    capture_breaker_.clear();
    body();
    capturing_ = false;
    cudaGraph_t graph = nullptr;
    const cudaError_t end = cudaStreamEndCapture(stream_, &graph);
    free_held_blocks();
    std::string why = capture_breaker_;
    if (why.empty() && end != cudaSuccess)
      why = std::string("the capture was invalidated (") + cudaGetErrorName(end) + ": " + cudaGetErrorString(end) + ")";
    if (why.empty()) {
      const cudaError_t inst = cudaGraphInstantiate(&g->exec, graph, 0);
      if (inst != cudaSuccess) why = std::string("instantiation failed (") + cudaGetErrorName(inst) + ")";
    }
    if (graph) cudaGraphDestroy(graph);
    if (!why.empty()) {
      (void)cudaGetLastError();  // the capture's error is reported here, not by the next launch
      graph_by_key_.erase(key);
      return Status::NotSupported("CUDA graph capture of step " + std::to_string(key) + " failed: " + why +
                                  " cannot run inside a graph (run with --cuda-graphs off)");
    }
  }
  KL_CUDA(cudaGraphLaunch(g->exec, stream_), "graph " + std::to_string(key) + " replay");
  return Status();
}

void CudaBackend::clear_graphs() {
  if (!graph_by_key_.empty()) sync("clear_graphs");
  graph_by_key_.clear();
}

}  // namespace klinear::cuda
