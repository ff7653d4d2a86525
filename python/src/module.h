// The parts of the extension module strata._strata, each bound by its own file.
#pragma once

#include <nanobind/nanobind.h>

namespace strata::py {

void BindAdam(nanobind::module_& m);  // adam_py.cc
void BindIo(nanobind::module_& m);    // io_py.cc
void BindEngine(nanobind::module_& m);  // engine_py.cc

}  // namespace strata::py
