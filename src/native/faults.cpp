// Fault injection (faults.h) and its private binding.
#include "faults.h"

#include <nanobind/nanobind.h>
#include <nanobind/stl/string.h>

#include "errors.h"

namespace nb = nanobind;

namespace llamaspec {

namespace {
std::atomic<int> g_faults[(int) Fault::Count];
const char * const kNames[(int) Fault::Count] = {"seq_rm_fails", "throw_unknown", "slow_free_ms"};
}  // namespace

void inject_fault(const std::string & name, int n) {
    for (int i = 0; i < (int) Fault::Count; ++i) {
        if (name == kNames[i]) {
            g_faults[i].store(n < 0 ? 0 : n);
            return;
        }
    }
    throw Error(ErrorKind::InvalidOption, "unknown fault '" + name + "'");
}

bool fault_fires(Fault f) {
    std::atomic<int> & v = g_faults[(int) f];
    if (v.load(std::memory_order_relaxed) <= 0) return false;
    return v.fetch_sub(1) == 1;
}

int fault_value(Fault f) { return g_faults[(int) f].load(std::memory_order_relaxed); }

void register_faults(nb::module_ & m) {
    m.def("_inject_fault", &inject_fault, nb::arg("name"), nb::arg("n"),
          "Tests only: arm a fault (seq_rm_fails / throw_unknown: at the n-th check; slow_free_ms: n ms; 0: off).");
}

}  // namespace llamaspec
