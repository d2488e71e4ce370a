// Reading the option dicts that the Python face has validated (names and types already checked).
#pragma once

#include <nanobind/nanobind.h>

namespace llamaspec {

// Sets `out` from d[key] and returns true, unless the key is absent or None.
template <typename T> bool dict_get(const nanobind::dict & d, const char * key, T & out) {
    if (!d.contains(key)) return false;
    nanobind::object v = d[key];
    if (v.is_none()) return false;
    out = nanobind::cast<T>(v);
    return true;
}

}  // namespace llamaspec
