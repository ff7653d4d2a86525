// `strata plan --model-file`: the model a safetensors file's header describes (a Hugging
// Face checkpoint, say), read from the header alone, never the tensor data.
//
// - Tensors: each name of the header is one tensor of its shape (a scalar as one
//   element); "__metadata__" is ignored. A header cannot show tied weights: two names
//   that a model ties are two tensors here, counted twice.
// - Modules: the tensors sharing a name prefix (everything before the last '.';
//   "h.0.attn.c_attn.weight" and ".bias" form "h.0.attn.c_attn"; a name without a dot is
//   its own module), in the order of the data offsets, which is the order the file
//   stores its tensors (the JSON's key order means nothing).
// - Dtypes: F32, BF16 and F16 are accepted; the engine's dtypes are the config's (as
//   `strata train --init-from` converts), so the file's do not change the plan.
// - Memory: the engine's plan of that declaration, exact as for the built-in models.
// - Compute: no forward code exists for an arbitrary model, so its time is estimated,
//   not measured: 6 flops per parameter per token (2 forward, 4 backward; attention's
//   products are not counted), seq tokens a sequence, at the rates' compute rate.
//   The calibration (--measure) times a stand-in: the reference MLP at the header's
//   width (the dimension most of its matrices share), one row per token.
// - Activations: unknown without forward code; the plan says they are not counted.
#pragma once

#include <cstdint>
#include <string>

#include "strata/status.h"
#include "tools/plan_model.h"

namespace strata::tools {

// The plan's model of the safetensors file at `path`, on sequences of `seq` tokens.
// Errors name the file and what is wrong: NotFound (no such file), IoError, Corruption
// (not a safetensors header: short, a length past the file, not JSON, offsets outside
// the data or overlapping, bytes that do not match dtype x shape), InvalidArgument (a
// dtype other than F32, BF16 and F16, a tensor without elements, no tensors, seq < 1).
Result<PlanModel> SafetensorsPlanModel(const std::string& path, int64_t seq);

}  // namespace strata::tools
