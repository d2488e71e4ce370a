// The private native module llamaspec._native: one register_<area>() per binding file.
#include <nanobind/nanobind.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "ggml-backend.h"
#include "llama.h"
#include "errors.h"
#include "logging.h"

namespace llamaspec {
void register_model(nanobind::module_ & m);
void register_context(nanobind::module_ & m);
void register_session(nanobind::module_ & m);
void register_faults(nanobind::module_ & m);
void register_structured(nanobind::module_ & m);
void register_chat(nanobind::module_ & m);
void register_embed(nanobind::module_ & m);
void register_rpc(nanobind::module_ & m);
}  // namespace llamaspec

namespace nb = nanobind;

NB_MODULE(_native, m) {
    m.doc() = "llamaspec's native core (private: import from llamaspec instead).";
    // Models held by long-lived Python objects at interpreter exit are reported as "leaks" by
    // nanobind on stderr; they are freed by the OS, and a library must not print.
    nb::set_leak_warnings(false);
    llamaspec::install_log_routing();
    llama_backend_init();

    llamaspec::register_errors(m);
    llamaspec::register_logging(m);
    llamaspec::register_model(m);
    llamaspec::register_context(m);
    llamaspec::register_session(m);
    llamaspec::register_faults(m);
    llamaspec::register_structured(m);
    llamaspec::register_chat(m);
    llamaspec::register_embed(m);
    llamaspec::register_rpc(m);

    m.def("system_info", [] { return std::string(llama_print_system_info()); },
          "llama.cpp's description of the compiled CPU features and backends.");
    m.def(
        "backends",
        [] {
            // ggml's backend registries (CPU, CUDA, Metal, RPC, ...) and the devices each offers
            using Device = std::tuple<std::string, std::string, std::string>;
            std::vector<std::pair<std::string, std::vector<Device>>> out;
            for (size_t i = 0; i < ggml_backend_reg_count(); ++i) {
                ggml_backend_reg_t reg = ggml_backend_reg_get(i);
                std::vector<Device> devices;
                for (size_t j = 0; j < ggml_backend_reg_dev_count(reg); ++j) {
                    ggml_backend_dev_t dev = ggml_backend_reg_dev_get(reg, j);
                    const char * kind = "accel";
                    switch (ggml_backend_dev_type(dev)) {
                        case GGML_BACKEND_DEVICE_TYPE_CPU: kind = "cpu"; break;
                        case GGML_BACKEND_DEVICE_TYPE_GPU: kind = "gpu"; break;
                        case GGML_BACKEND_DEVICE_TYPE_IGPU: kind = "igpu"; break;
                        default: break;
                    }
                    devices.emplace_back(ggml_backend_dev_name(dev), ggml_backend_dev_description(dev), kind);
                }
                out.emplace_back(ggml_backend_reg_name(reg), std::move(devices));
            }
            return out;
        },
        "The compiled backends: (registry name, its devices as (name, description, kind)), kind one of "
        "'cpu', 'gpu', 'igpu', 'accel'.");
    m.def("max_devices", [] { return llama_max_devices(); });
    m.def("supports_gpu_offload", [] { return llama_supports_gpu_offload(); });
    m.def("supports_mmap", [] { return llama_supports_mmap(); });
    m.def("supports_mlock", [] { return llama_supports_mlock(); });
}
