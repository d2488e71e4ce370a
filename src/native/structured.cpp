// Structured output: JSON schemas turned into GBNF grammars by common's converter.
#include <string>
#include <vector>

#include <nanobind/nanobind.h>
#include <nanobind/stl/string.h>

#include "errors.h"
#include "json-schema-to-grammar.h"  // common
#include "json.h"                    // common

namespace nb = nanobind;

namespace llamaspec {

namespace {

// The GBNF grammar of a JSON schema (given as JSON text). Anything the converter cannot enforce is an
// InvalidOption error naming it: a grammar that lets through what the schema forbids would make the
// caller's validation fail later, far from the cause. Patch 0012 hands the converter's warnings here
// instead of printing them.
std::string schema_grammar(const std::string & schema_json) {
    common_json schema;
    try {
        schema = common_json::parse(schema_json);
    } catch (const std::exception & e) {
        throw Error(ErrorKind::InvalidOption, std::string("json_schema is not valid JSON: ") + e.what());
    }
    if (!schema.is_object()) {
        throw Error(ErrorKind::InvalidOption, "json_schema must be a JSON object");
    }
    std::vector<std::string> warnings;
    std::string grammar;
    try {
        grammar = json_schema_to_grammar(schema, /*force_gbnf=*/true, &warnings);
    } catch (const std::exception & e) {
        throw Error(ErrorKind::InvalidOption, std::string("json_schema: ") + e.what());
    }
    if (!warnings.empty()) {
        std::string why;
        for (const std::string & w : warnings) why += (why.empty() ? "" : "; ") + w;
        throw Error(ErrorKind::InvalidOption, "json_schema is not supported: " + why);
    }
    return grammar;
}

}  // namespace

void register_structured(nb::module_ & m) {
    m.def("json_schema_to_grammar", &schema_grammar, nb::arg("schema_json"),
          "The GBNF grammar that accepts exactly the JSON the schema (JSON text) describes; "
          "InvalidOptionError for invalid JSON, an invalid schema, or a part the converter cannot enforce.");
}

}  // namespace llamaspec
