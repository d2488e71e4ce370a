// Fault injection for the tests of error paths that a healthy llama.cpp never takes (a failed cache
// rollback, an exception of an unknown type on the engine thread, a slow free). Off unless a test
// arms one through the private _native._inject_fault(); each check is one relaxed atomic load.
#pragma once

#include <atomic>
#include <string>

namespace llamaspec {

enum class Fault {
    SeqRmFails,     // the n-th cache rollback of the engine reports failure
    ThrowUnknown,   // the n-th engine iteration throws an int (not a std::exception)
    SlowFreeMs,     // every Context destructor first sleeps this many milliseconds
    Count,
};

// Arms a fault: for the counted ones, fire at the n-th check (n >= 1; 0 disarms); for SlowFreeMs, n ms.
void inject_fault(const std::string & name, int n);

// Counted faults: true exactly once, at the n-th call after arming.
bool fault_fires(Fault f);

// The armed value (SlowFreeMs), 0 when off.
int fault_value(Fault f);

}  // namespace llamaspec
