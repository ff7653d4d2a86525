// strata._strata: the C++ half of the `strata` Python package (see python/strata/).
#include "module.h"

#include <nanobind/nanobind.h>

NB_MODULE(_strata, m) {
  m.doc() = "strata's C++ engine parts for Python: CPU Adam (adam_step) and io_uring I/O (IoHandle)";
  strata::py::BindAdam(m);
  strata::py::BindIo(m);
}
