// llama.cpp logs through llama_log_set (libllama and ggml) and through common's own common_log
// singleton, which prints to the console from a worker thread and has no callback. We route the first
// into a Python callable (the Python face forwards it to logging.getLogger("llamaspec.llama_cpp"))
// and pause the second, which silences it (docs/adr/0005-logging.md).
#include "logging.h"

#include "gil.h"

#include <atomic>
#include <mutex>

#include "ggml.h"
#include "llama.h"
#include "log.h"  // common

namespace nb = nanobind;

namespace llamaspec {

namespace {

// Messages below this ggml level are dropped without touching the GIL. The Python face keeps it in
// step with the effective level of the "llamaspec.llama_cpp" logger.
std::atomic<int> g_min_level{GGML_LOG_LEVEL_WARN};

std::mutex g_callback_mutex;
PyObject * g_callback = nullptr;  // strong reference, guarded by g_callback_mutex and the GIL

thread_local LogCapture * t_capture = nullptr;
thread_local std::string t_partial;          // text of a line not yet ended by '\n'
thread_local int t_partial_level = GGML_LOG_LEVEL_INFO;

void forward_to_python(int level, const std::string & line) {
    if (level < g_min_level.load(std::memory_order_relaxed)) {
        return;
    }
    if (!Py_IsInitialized() || python_finalizing()) {
        return;
    }
    nb::gil_scoped_acquire gil;
    PyObject * cb = nullptr;
    {
        std::lock_guard<std::mutex> lock(g_callback_mutex);
        cb = g_callback;
        Py_XINCREF(cb);
    }
    if (cb == nullptr) {
        return;
    }
    // llama.cpp may log partial multi-byte characters (e.g. token pieces): decode with "replace".
    PyObject * py_level = PyLong_FromLong(level);
    PyObject * py_text = PyUnicode_DecodeUTF8(line.data(), (Py_ssize_t) line.size(), "replace");
    PyObject * res = nullptr;
    if (py_level != nullptr && py_text != nullptr) {
        res = PyObject_CallFunctionObjArgs(cb, py_level, py_text, nullptr);
    }
    if (res == nullptr) {
        PyErr_Clear();  // a failing log handler must never break generation
    }
    Py_XDECREF(res);
    Py_XDECREF(py_level);
    Py_XDECREF(py_text);
    Py_DECREF(cb);
}

void emit_line(int level, std::string line) {
    while (!line.empty() && (line.back() == '\n' || line.back() == '\r')) {
        line.pop_back();
    }
    if (line.empty()) {
        return;
    }
    capture_line(level, line);
    forward_to_python(level, line);
}

void llama_log_callback(ggml_log_level level, const char * text, void *) {
    if (text == nullptr) {
        return;
    }
    int lvl = (int) level;
    if (level == GGML_LOG_LEVEL_CONT) {
        lvl = t_partial_level;  // a continuation keeps the level of the line it continues
    } else if (!t_partial.empty()) {
        emit_line(t_partial_level, std::move(t_partial));
        t_partial.clear();
    }
    t_partial_level = lvl;
    t_partial += text;
    // emit every complete line; keep an unfinished one for the next fragment
    size_t start = 0;
    for (size_t nl = t_partial.find('\n'); nl != std::string::npos; nl = t_partial.find('\n', start)) {
        emit_line(lvl, t_partial.substr(start, nl - start));
        start = nl + 1;
    }
    t_partial.erase(0, start);
}

}  // namespace

void capture_line(int level, const std::string & line) {
    if (t_capture != nullptr && level >= GGML_LOG_LEVEL_WARN && level <= GGML_LOG_LEVEL_ERROR) {
        t_capture->lines_.push_back(line);
        t_capture->levels_.push_back(level);
    }
}

LogCapture::LogCapture() : outer_(t_capture) { t_capture = this; }
LogCapture::~LogCapture() { t_capture = outer_; }

std::string LogCapture::summary() const {
    std::string out;
    for (int want : {GGML_LOG_LEVEL_ERROR, GGML_LOG_LEVEL_WARN}) {
        for (size_t i = 0; i < lines_.size(); ++i) {
            if (levels_[i] != want) continue;
            if (!out.empty()) out += "; ";
            out += lines_[i];
        }
        if (!out.empty()) break;
    }
    return out;
}

bool LogCapture::contains(const std::string & needle) const {
    for (const auto & l : lines_) {
        if (l.find(needle) != std::string::npos) return true;
    }
    return false;
}

void install_log_routing() {
    llama_log_set(llama_log_callback, nullptr);
    // common_log: stop its console worker (messages are discarded while paused) and skip formatting.
    common_log_set_verbosity_thold(-1);
    common_log_pause(common_log_main());
}

void register_logging(nb::module_ & m) {
    m.def(
        "set_log_callback",
        [](nb::object cb) {
            PyObject * old = nullptr;
            {
                std::lock_guard<std::mutex> lock(g_callback_mutex);
                old = g_callback;
                g_callback = cb.is_none() ? nullptr : cb.release().ptr();
            }
            Py_XDECREF(old);
        },
        nb::arg("callback").none(),
        "Set the callable (level: int, message: str) that receives llama.cpp's log lines, or None.");
    m.def(
        "set_log_level", [](int level) { g_min_level.store(level, std::memory_order_relaxed); },
        nb::arg("level"), "Drop llama.cpp log lines below this ggml level before they reach Python.");
    m.attr("LOG_LEVEL_DEBUG") = (int) GGML_LOG_LEVEL_DEBUG;
    m.attr("LOG_LEVEL_INFO") = (int) GGML_LOG_LEVEL_INFO;
    m.attr("LOG_LEVEL_WARN") = (int) GGML_LOG_LEVEL_WARN;
    m.attr("LOG_LEVEL_ERROR") = (int) GGML_LOG_LEVEL_ERROR;
}

}  // namespace llamaspec
