// Typed errors raised by the native core and translated into llamaspec.errors classes.
#pragma once

#include <stdexcept>
#include <string>
#include <vector>

#include <nanobind/nanobind.h>

namespace llamaspec {

// One entry per Python class in src/llamaspec/errors.py (the translator looks the class up by name).
enum class ErrorKind {
    Generic,          // LlamaspecError
    ModelLoad,        // ModelLoadError
    UnsupportedModel, // UnsupportedModelError
    ContextOverflow,  // ContextOverflowError
    Busy,             // BusyError
    Timeout,          // GenerationTimeout
    InvalidOption,    // InvalidOptionError
    Grammar,          // GrammarError
    ChatTemplate,     // ChatTemplateError
    Decode,           // DecodeError
    Closed,             // ClosedError
    IncompatibleVocab,  // IncompatibleVocabError
    DraftModelRequired, // DraftModelRequiredError
    LoadCancelled,      // LoadCancelledError
    Backend,            // BackendError
};

// A C++ exception that carries what the Python exception needs: its class, a message, llama.cpp's
// return code where there is one, and the path of the file involved where there is one.
class Error : public std::runtime_error {
public:
    Error(ErrorKind kind, const std::string & message, int code = 0, bool has_code = false,
          std::string path = {})
        : std::runtime_error(message), kind(kind), code(code), has_code(has_code), path(std::move(path)) {}

    static Error with_code(ErrorKind kind, const std::string & message, int code) {
        return Error(kind, message, code, true);
    }

    ErrorKind kind;
    int code;
    bool has_code;
    std::string path;
};

const char * error_class_name(ErrorKind kind);

void register_errors(nanobind::module_ & m);

}  // namespace llamaspec
