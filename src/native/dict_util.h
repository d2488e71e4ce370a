// Reading the option dicts that the Python face has validated (names, types and ranges checked in
// src/llamaspec/_options.py). Each native reader is ONE table of (name, setter); a key the table
// lacks raises InvalidOption, and a test checks that each table names exactly the options its
// Python table offers, so an option is added in one table per side and cannot be dropped silently.
#pragma once

#include <string>
#include <vector>

#include <nanobind/nanobind.h>

#include "errors.h"

namespace llamaspec {

// Sets `out` from d[key] and returns true, unless the key is absent or None.
template <typename T> bool dict_get(const nanobind::dict & d, const char * key, T & out) {
    if (!d.contains(key)) return false;
    nanobind::object v = d[key];
    if (v.is_none()) return false;
    out = nanobind::cast<T>(v);
    return true;
}

// One option of a native parameter struct P: its name and how a (validated, not None) value sets it.
template <typename P> struct OptionField {
    const char * name;
    void (*set)(P & params, nanobind::handle value);
};

// A field set by a plain cast: OPTION_FIELD(P, "top_k", top_k, int32_t).
#define LLAMASPEC_OPTION_FIELD(P, name, member, type) \
    OptionField<P> { name, [](P & p, nanobind::handle v) { p.member = (decltype(p.member)) nanobind::cast<type>(v); } }

// Applies every key of `d` (None values are skipped) through `table`.
template <typename P, size_t N>
void apply_options(P & params, const nanobind::dict & d, const OptionField<P> (&table)[N], const char * what) {
    for (auto item : d) {
        if (item.second.is_none()) continue;
        const std::string key = nanobind::cast<std::string>(item.first);
        bool found = false;
        for (const auto & f : table) {
            if (key == f.name) {
                f.set(params, item.second);
                found = true;
                break;
            }
        }
        if (!found) throw Error(ErrorKind::InvalidOption, std::string("unknown ") + what + " '" + key + "'");
    }
}

template <typename P, size_t N> std::vector<std::string> option_names(const OptionField<P> (&table)[N]) {
    std::vector<std::string> out;
    for (const auto & f : table) out.emplace_back(f.name);
    return out;
}

}  // namespace llamaspec
