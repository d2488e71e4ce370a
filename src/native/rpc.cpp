// llama.cpp's RPC backend (ggml-rpc): connecting a Model to its workers, noticing when one fails, and
// the worker's server loop behind `llamaspec rpc-server` (docs/adr/0029).
#include "rpc.h"

#include <cmath>

#include <nanobind/stl/string.h>

#include "ggml-rpc.h"
#include "errors.h"

namespace nb = nanobind;

namespace llamaspec {

// "host:port" with a non-empty host and a port in 1..65535 (what ggml's parser accepts, checked
// first so that a typo is an InvalidOptionError, not a connection failure)
static void check_endpoint(const std::string & endpoint) {
    const size_t colon = endpoint.rfind(':');
    bool ok = colon != std::string::npos && colon > 0 && colon + 1 < endpoint.size() && colon + 6 >= endpoint.size();
    if (ok) {
        for (size_t i = colon + 1; i < endpoint.size(); ++i) ok = ok && endpoint[i] >= '0' && endpoint[i] <= '9';
    }
    if (ok) {
        const long port = std::stol(endpoint.substr(colon + 1));
        ok = port >= 1 && port <= 65535;
    }
    if (ok) {
        for (char ch : endpoint.substr(0, colon)) ok = ok && ch != ' ' && ch != '/' && ch != ':';
    }
    if (!ok) {
        throw Error(ErrorKind::InvalidOption,
                    "rpc_servers: '" + endpoint + "' is not an endpoint of the form host:port (port 1-65535)");
    }
}

void RpcWorkers::connect(const std::vector<std::string> & endpoints, double timeout_s,
                         std::vector<ggml_backend_dev_t> & devices) {
    if (endpoints.size() > GGML_RPC_MAX_SERVERS) {
        throw Error(ErrorKind::InvalidOption, "rpc_servers: at most " + std::to_string(GGML_RPC_MAX_SERVERS) +
                                                  " workers, not " + std::to_string(endpoints.size()));
    }
    for (const std::string & e : endpoints) check_endpoint(e);
    if (!(timeout_s >= 0) || timeout_s > 86400) {
        throw Error(ErrorKind::InvalidOption, "rpc_timeout must be between 0 (none) and 86400 seconds");
    }
    // process-wide in ggml: it applies to the connections opened from now on (an endpoint already
    // connected by another model keeps the timeout it was opened with)
    ggml_backend_rpc_set_timeout((uint32_t) std::ceil(timeout_s * 1000.0));
    for (const std::string & e : endpoints) {
        const uint64_t before = ggml_backend_rpc_get_failure_count(e.c_str());
        ggml_backend_reg_t reg = ggml_backend_rpc_add_server(e.c_str());
        if (reg == nullptr || ggml_backend_rpc_get_failure_count(e.c_str()) != before) {
            throw Error(ErrorKind::ModelLoad, "cannot reach the RPC worker at " + e +
                                                  " (is `llamaspec rpc-server` running there, and reachable?)");
        }
        endpoints_.push_back(e);
        failures_.push_back(before);
        for (size_t i = 0; i < ggml_backend_reg_dev_count(reg); ++i) devices.push_back(ggml_backend_reg_dev_get(reg, i));
    }
}

void RpcWorkers::check() const {
    for (size_t i = 0; i < endpoints_.size(); ++i) {
        if (ggml_backend_rpc_get_failure_count(endpoints_[i].c_str()) != failures_[i]) {
            throw Error(ErrorKind::Backend, "the RPC worker at " + endpoints_[i] +
                                                " failed (it stopped, went silent past rpc_timeout or answered "
                                                "wrongly); this model's layers there are lost: load the model again");
        }
    }
}

std::vector<ggml_backend_dev_t> local_gpus() {
    std::vector<ggml_backend_dev_t> out;
    for (size_t i = 0; i < ggml_backend_dev_count(); ++i) {
        ggml_backend_dev_t d = ggml_backend_dev_get(i);
        const auto type = ggml_backend_dev_type(d);
        if (type == GGML_BACKEND_DEVICE_TYPE_GPU || type == GGML_BACKEND_DEVICE_TYPE_IGPU) out.push_back(d);
    }
    return out;
}

void register_rpc(nb::module_ & m) {
    m.def(
        "rpc_serve",
        [](const std::string & endpoint, int n_threads, const std::string & cache_dir) {
            check_endpoint(endpoint);
            if (n_threads < 1) throw Error(ErrorKind::InvalidOption, "threads must be at least 1");
            ggml_backend_dev_t cpu = ggml_backend_dev_by_type(GGML_BACKEND_DEVICE_TYPE_CPU);
            if (cpu == nullptr) throw Error(ErrorKind::Generic, "this build has no CPU device");
            // the local accelerators (as upstream's rpc-server), the CPU where there is none
            std::vector<ggml_backend_dev_t> devs = local_gpus();
            if (devs.empty()) devs.push_back(cpu);
            nb::gil_scoped_release nogil;
            // returns only when the socket cannot be made (it printed why); serves until killed
            ggml_backend_rpc_start_server(endpoint.c_str(), cache_dir.empty() ? nullptr : cache_dir.c_str(),
                                          (size_t) n_threads, devs.size(), devs.data());
        },
        nb::arg("endpoint"), nb::arg("n_threads"), nb::arg("cache_dir"),
        "Serve this machine's devices to RPC clients at endpoint (releases the GIL; returns only when the "
        "socket cannot be made).");
}

}  // namespace llamaspec
