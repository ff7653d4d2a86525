// strata._strata: the C++ half of the `strata` Python package (see python/strata/).
#include "module.h"

#include <nanobind/nanobind.h>

NB_MODULE(_strata, m) {
  m.doc() = "strata's C++ engine parts for Python: CPU Adam (adam_step), io_uring I/O (IoHandle) and the ZeRO engine (Engine)";
  strata::py::BindAdam(m);
  strata::py::BindIo(m);
  strata::py::BindEngine(m);
}
