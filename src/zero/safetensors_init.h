// Initial values from a safetensors file (`strata train --init-from`): an export of a
// strata checkpoint, or weights written elsewhere (torch, the safetensors library),
// matched to the model's tensors by name. The header is read and checked at open; the
// values are read with pread as the engine asks for each range (never the whole model in
// memory), converted to fp32 from F32, BF16 or F16.
//
// Threads: the init may be called from any thread, one call at a time (Engine::Create).
#pragma once

#include <memory>
#include <string>

#include "strata/engine.h"
#include "strata/module_hooks.h"
#include "strata/status.h"

namespace strata::zero {

struct SafetensorsInit {
  ParamInit init;
  // The first read error of `init` (which cannot return one): check it once the engine
  // exists, and do not train on values it may have left as zeros.
  std::shared_ptr<Status> read_error;
  int tensors = 0;  // the file's tensors (all of the model's)
};

// NotFound when `path` cannot be opened; Corruption when it is not a safetensors file
// (header length, JSON, offsets outside the data or overlapping, sizes that do not match
// dtype x shape); InvalidArgument listing every mismatch with `model`: a tensor the model
// has and the file lacks, one the file has and the model lacks, a shape that differs, a
// dtype other than F32, BF16 and F16.
Result<SafetensorsInit> OpenSafetensorsInit(const std::string& path, const ModelDecl& model);

}  // namespace strata::zero
