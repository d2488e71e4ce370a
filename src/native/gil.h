// The GIL around native work that may run on a Python thread: destructors of native resources
// release it (freeing a large model or context takes long), and log forwarding checks that Python
// is still there.
#pragma once

#include <Python.h>

namespace llamaspec {

// True while the interpreter is shutting down (public API since 3.13, private before).
inline bool python_finalizing() {
#if PY_VERSION_HEX >= 0x030D0000
    return Py_IsFinalizing() != 0;
#else
    return _Py_IsFinalizing() != 0;
#endif
}

// Releases the GIL for its scope when this thread holds it (a destructor run by Python's garbage
// collection or reference counting); does nothing on other threads or while Python finalizes.
class GilReleasedIfHeld {
public:
    GilReleasedIfHeld() {
        if (Py_IsInitialized() && !python_finalizing() && PyGILState_Check()) state_ = PyEval_SaveThread();
    }
    ~GilReleasedIfHeld() {
        if (state_ != nullptr) PyEval_RestoreThread(state_);
    }
    GilReleasedIfHeld(const GilReleasedIfHeld &) = delete;
    GilReleasedIfHeld & operator=(const GilReleasedIfHeld &) = delete;

private:
    PyThreadState * state_ = nullptr;
};

}  // namespace llamaspec
