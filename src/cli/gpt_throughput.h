// The GPT run's throughput at its end: tokens/s, the model flops they stand for, and
// those flops beside the rate this machine's matrix products reach on the model's
// largest product, measured then (model flops utilisation, MFU).
#pragma once

#include <nlohmann/json.hpp>
#include <string>

#include "strata/gpt.h"

namespace strata::cli {

// From the run's step lines (each with "tokens_per_s", the global batch's tokens over
// the step's time): the median rate of the steps after the first two (which record the
// call order and tune the overlap; all steps when there are no more than three), the
// model flops a rank computes per second at that rate (model::GptFlopsPerSequence, split
// over `world` ranks), and the best rate of the backend's products on [micro_batch x seq,
// n_embd] x [n_embd, 4 n_embd] (the MLP's first product) over about 0.3 s: model::Gemm on
// this rank's threads for kCpu, the CUDA linear layer (cuBLAS, with its conversions and
// bias) with `weights` as the model's parameters for kCuda.
// Keys: tokens_per_s, steps_timed, first_step, model_flops_per_s, gemm_flops_per_s,
// gemm_shape, gemm_library, mfu; where the GPU's probe failed, gemm_error instead of the
// rate and the MFU. Empty when there are no steps.
nlohmann::json GptThroughput(const model::GptSpec& spec, int64_t seq, int64_t micro_batch, int world,
                             const nlohmann::json& steps, Backend backend = Backend::kCpu,
                             DType weights = DType::kF32);

// "throughput: 11.6K tokens/s (median of steps 3-40); model flops 1.23 GFLOP/s a rank, MFU
// 41% of 3.01 GFLOP/s, Gemm's best on [1024 x 128] x [128 x 512] here now" (the CUDA
// linear layer's on a GPU; "no MFU: <why>" where its probe failed).
std::string ThroughputLine(const nlohmann::json& t);

}  // namespace strata::cli
