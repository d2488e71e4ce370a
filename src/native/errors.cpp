// Translation of llamaspec::Error into the Python classes of llamaspec.errors.
#include "errors.h"

namespace nb = nanobind;

namespace llamaspec {

const char * error_class_name(ErrorKind kind) {
    switch (kind) {
        case ErrorKind::Generic:          return "LlamaspecError";
        case ErrorKind::ModelLoad:        return "ModelLoadError";
        case ErrorKind::UnsupportedModel: return "UnsupportedModelError";
        case ErrorKind::ContextOverflow:  return "ContextOverflowError";
        case ErrorKind::Busy:             return "BusyError";
        case ErrorKind::Timeout:          return "GenerationTimeout";
        case ErrorKind::InvalidOption:    return "InvalidOptionError";
        case ErrorKind::Grammar:          return "GrammarError";
        case ErrorKind::ChatTemplate:     return "ChatTemplateError";
        case ErrorKind::Decode:           return "DecodeError";
        case ErrorKind::Closed:           return "ClosedError";
        case ErrorKind::IncompatibleVocab:  return "IncompatibleVocabError";
        case ErrorKind::DraftModelRequired: return "DraftModelRequiredError";
        case ErrorKind::LoadCancelled:      return "LoadCancelledError";
        case ErrorKind::Backend:            return "BackendError";
    }
    return "LlamaspecError";
}

static void raise_python(const Error & e) {
    // llamaspec.errors is pure Python and imported by the package before any native call, so the
    // import below is a dictionary lookup in sys.modules.
    nb::module_ errors = nb::module_::import_("llamaspec.errors");
    nb::object cls = errors.attr(error_class_name(e.kind));
    nb::object code = e.has_code ? nb::object(nb::int_(e.code)) : nb::none();
    nb::object path = e.path.empty() ? nb::none() : nb::object(nb::str(e.path.c_str()));
    nb::object exc = cls(nb::str(e.what()), nb::arg("code") = code, nb::arg("path") = path);
    PyErr_SetObject(cls.ptr(), exc.ptr());
}

void register_errors(nb::module_ &) {
    nb::register_exception_translator([](const std::exception_ptr & p, void *) {
        try {
            std::rethrow_exception(p);
        } catch (const Error & e) {
            try {
                raise_python(e);
            } catch (nb::python_error & pe) {
                pe.restore();
            }
        }
    });
}

}  // namespace llamaspec
