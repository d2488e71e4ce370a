// llama.cpp's RPC backend: a model's remote workers (connection, failure) and the worker's own loop.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nanobind/nanobind.h>

#include "ggml-backend.h"

namespace llamaspec {

// The RPC workers one Model was loaded onto. ggml keeps one connection per endpoint in the process,
// shared by every model on it; a broken connection (worker gone, silent past the timeout, malformed
// answer) no longer aborts the process (patches/0013): ggml counts it, and check() turns a count
// that rose since connect() into Error(Backend), for good: the model's remote weights are gone.
class RpcWorkers {
public:
    RpcWorkers() = default;

    // Validates each endpoint ("host:port"; Error(InvalidOption)), sets the timeout of the
    // connections opened from now on (0: none) and connects, appending each worker's devices to
    // `devices`; an unreachable worker raises Error(ModelLoad) naming it. Call without the GIL.
    void connect(const std::vector<std::string> & endpoints, double timeout_s,
                 std::vector<ggml_backend_dev_t> & devices);

    bool empty() const { return endpoints_.empty(); }
    const std::vector<std::string> & endpoints() const { return endpoints_; }

    // Throws Error(Backend) when a connection to one of the workers failed since connect(); every
    // later check throws too (ggml's counts only grow). Cheap: one lock and lookup per worker.
    void check() const;

private:
    std::vector<std::string> endpoints_;
    std::vector<uint64_t> failures_;  // ggml's failure count of each endpoint when it connected
};

// This process's GPUs (integrated ones included), in ggml's order: where llama.cpp offloads by
// default, and what a worker serves.
std::vector<ggml_backend_dev_t> local_gpus();

void register_rpc(nanobind::module_ & m);

}  // namespace llamaspec
