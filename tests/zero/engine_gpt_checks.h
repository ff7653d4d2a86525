// The GPT (model::Gpt, gpt.h) trained through the engine against a dense single-rank
// reference: the same driver over DenseHooks (chain_model.h), gradients summed over the
// global batch, DeepSpeed's clipping rule and AdamStepReference per tensor, as
// engine_model_checks.h does for the chain models. Run at world size 1 (engine_gpt_test)
// and under mpirun -np 2 and -np 4 (engine_gpt_mpi_test).
//
// Data: sequence s of the dataset is seq + 1 token ids hashed from (data seed, s), the
// first seq the inputs and the last seq the targets; sequences are numbered as model.h's
// BatchSlice numbers samples, so world N with micro-batch B sees exactly the sequences of
// world 1 with micro-batch N * B. The normaliser is the global batch's token count.
//
// Tolerances: engine_model_checks.h's for the losses, gradient norms and clip coefficients
// (ExpectChainMatches), for the same reasons: the engine steps with the SIMD fp32 Adam
// and, at world > 1, sums per-rank partial gradients, against a double-precision Adam and
// a one-pass gradient. Parameters: atol kGptAtol = 1e-4 (chains: 2e-5), rtol 1e-4. The GPT
// has thousands of gradient elements that cancel to near Adam's eps (1e-8): at world 2,
// h1.mlp.fc.weight[2592] sums to 2.1e-8 in step 0; there Adam's update lr g / (|g| + eps)
// has slope ~lr / (4 eps) = 2.5e5, so summation-order differences of ~1e-10 in such a
// gradient move the element by ~2e-5 (seen: 0.99 of the chains' atol). 1e-4 is 5x that
// and still lr / 100, far below the ~lr that a wrong or missing update moves an element;
// gradients counted twice or dropped show in the norm (rtol 1e-4), as Adam's first steps
// are blind to a gradient's scale. The key bias has its own bound (CheckKeyBias).
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include "engine_model_checks.h"
#include "model/gpt_hooks.h"
#include "strata/gpt.h"

namespace strata::testing {

inline constexpr double kGptAtol = 1e-4, kGptRtol = 1e-4;

struct GptSetup {
  model::GptSpec spec;
  bool recompute = false;
  int steps = 3;
  int64_t micro_batch = 2;  // sequences per rank
  int64_t seq = 16;
  uint64_t data_seed = 11;
  // After each step, an evaluation pass (Engine::SetEvaluating) over eval_batch sequences
  // from sample kEvalFirst on; its loss goes into ChainRun::eval_losses.
  bool evaluate = false;
  int64_t eval_batch = 3;
};

inline constexpr int64_t kEvalFirst = 1'000'000;

struct GptVariant {
  std::string name;
  std::string extra_json;  // over MakeConfig's
  GptSetup setup;
};

inline TensorInit GptInit(const model::GptSpec& spec) {
  return [spec](TensorId t, int64_t b, int64_t n, float* out) { model::InitGptTensor(spec, t, b, n, out); };
}

// Sequences [first, first + n) of the dataset: tokens and targets [n, seq].
inline void FillGptBatch(const GptSetup& setup, int64_t first, int64_t n, std::vector<int32_t>* tokens,
                         std::vector<int32_t>* targets) {
  const int64_t t = setup.seq;
  tokens->resize(n * t);
  targets->resize(n * t);
  for (int64_t s = 0; s < n; ++s) {
    const std::vector<int32_t> ids = model::testing::HashTokens(
        t + 1, setup.data_seed, static_cast<uint64_t>(first + s), setup.spec.vocab_size);
    for (int64_t i = 0; i < t; ++i) {
      (*tokens)[s * t + i] = ids[i];
      (*targets)[s * t + i] = ids[i + 1];
    }
  }
}

// Trains `setup` with the engine on this rank's slices of the data (every rank calls it).
// The driver runs on the engine's backend: the CPU kernels on the sim device, the CUDA
// ones on its compute stream on a GPU.
inline ChainRun RunGptEngine(Communicator& world, const Config& config, const GptSetup& setup) {
  const ModelDecl decl = model::GptModel(setup.spec);
  auto dev = EngineDevice(config, config.strata.device);
  if (!dev.ok()) return FailedRun(dev.status());
  auto engine = Engine::Create(config, decl, GptInit(setup.spec), EngineResources{&world, dev->get()});
  if (!engine.ok()) return FailedRun(engine.status());
  Engine& e = **engine;
  model::Gpt gpt(setup.spec, e.model_backend(), e.model_stream());
  gpt.set_recompute(setup.recompute);
  ChainRun run;
  std::vector<int32_t> tokens, targets;
  const int accum = config.gradient_accumulation_steps;
  auto train = [&]() -> Status {
    for (int step = 0; step < setup.steps; ++step) {
      double loss = 0;
      const double scale = e.loss_scale();
      for (int mb = 0; mb < accum; ++mb) {
        const model::BatchSlice slice{step, world.rank(), world.size(), mb, accum, setup.micro_batch};
        FillGptBatch(setup, slice.FirstSampleIndex(), setup.micro_batch, &tokens, &targets);
        STRATA_RETURN_IF_ERROR(e.BeginMicroBatch());
        const double normaliser = static_cast<double>(slice.GlobalBatchSize() * setup.seq) / scale;
        STRATA_ASSIGN_OR_RETURN(double l, gpt.ForwardBackward(tokens.data(), targets.data(),
                                                              setup.micro_batch, setup.seq, normaliser, e));
        loss += l / scale;
      }
      STRATA_ASSIGN_OR_RETURN(StepResult r, e.Step());
      STRATA_ASSIGN_OR_RETURN(loss, zero::SumInRankOrder(world, loss));
      run.losses.push_back(loss);
      if (setup.evaluate) {
        STRATA_RETURN_IF_ERROR(e.SetEvaluating(true));
        FillGptBatch(setup, kEvalFirst, setup.eval_batch, &tokens, &targets);
        STRATA_ASSIGN_OR_RETURN(const double eval,
                                gpt.Forward(tokens.data(), targets.data(), setup.eval_batch, setup.seq,
                                            static_cast<double>(setup.eval_batch * setup.seq), e));
        run.eval_losses.push_back(eval);
        STRATA_RETURN_IF_ERROR(e.SetEvaluating(false));
      }
      run.grad_norms.push_back(r.grad_norm);
      run.clip_coefs.push_back(r.clip_coef);
      run.model_waits.push_back(r.model_wait_s);
    }
    return OkStatus();
  };
  return FinishRun(std::move(run), train(), e, **dev, gpt.modules().tensors.size());
}

// The same training on one rank with every parameter dense (TrainChainReference's steps).
inline ChainRun TrainGptReference(const Config& config, const GptSetup& setup, int world_size) {
  if (config.fp16.enabled) {
    return FailedRun(UnimplementedError("the GPT reference has no fp16 loss scaling"));
  }
  model::Gpt gpt(setup.spec);
  gpt.set_recompute(setup.recompute);
  DenseHooks dense(gpt.modules(), config.bf16 ? DType::kBf16 : DType::kF32, GptInit(setup.spec));
  const size_t num = gpt.modules().tensors.size();
  std::vector<std::vector<float>> m(num), v(num), acc(num);
  for (size_t t = 0; t < num; ++t) m[t] = v[t] = std::vector<float>(dense.master(t).size(), 0.0f);
  AdamParams adam = zero::AdamFromConfig(config);
  const int accum = config.gradient_accumulation_steps;
  const int64_t batch = setup.micro_batch * world_size;
  std::vector<int32_t> tokens, targets;
  ChainRun run;
  for (int step = 0; step < setup.steps; ++step) {
    double loss = 0;
    for (size_t t = 0; t < num; ++t) acc[t].assign(m[t].size(), 0.0f);
    for (int mb = 0; mb < accum; ++mb) {
      const model::BatchSlice slice{step, 0, 1, mb, accum, batch};
      FillGptBatch(setup, slice.FirstSampleIndex(), batch, &tokens, &targets);
      dense.BeginMicroBatch();
      auto l = gpt.ForwardBackward(tokens.data(), targets.data(), batch, setup.seq,
                                   static_cast<double>(slice.GlobalBatchSize() * setup.seq), dense);
      if (!l.ok()) return FailedRun(l.status());
      loss += *l;
      for (size_t t = 0; t < num; ++t) {
        for (size_t i = 0; i < acc[t].size(); ++i) acc[t][i] += dense.grad(t)[i];
      }
    }
    run.status = ReferenceUpdate(config, step, acc, adam, m, v, dense, run);
    if (!run.status.ok()) return run;
    dense.SyncCompute();
    run.losses.push_back(loss);
  }
  for (size_t t = 0; t < num; ++t) run.params.push_back(dense.master(t));
  return run;
}

// The key bias (columns C..2C of attn.qkv.bias) has a gradient of zero in exact arithmetic:
// adding a constant vector to every key adds the same q.b to all of a query's scores, which
// the softmax cancels. In fp32 it is rounding residue (~1e-10 here), and Adam divides that
// by its own running RMS (+ eps 1e-8), so each step moves those elements by up to ~lr in a
// direction that depends on how the residue rounded: the engine's and the reference's
// differ (3e-5 apart after 3 steps at world 1). Those elements are held to what Adam
// can move them, lr per step, here; the copy returned has the reference's values there,
// for ExpectChainMatches's tolerances on every other element.
inline ChainRun CheckKeyBias(const ChainRun& run, const ChainRun& ref, const GptVariant& var,
                             const std::string& what) {
  ChainRun masked = run;
  const model::GptSpec& spec = var.setup.spec;
  const double bound = MakeConfig({0, "none", "none"}, var.extra_json).optimizer.lr * var.setup.steps;
  if (run.status.ok() && run.params.size() == ref.params.size()) {
    for (int64_t l = 0; l < spec.n_layer; ++l) {
      const TensorId id = model::GptBlockTensorId(l, model::GptBlockTensor::kQkvBias);
      for (int64_t i = spec.n_embd; i < 2 * spec.n_embd; ++i) {
        EXPECT_NEAR(run.params[id][i], ref.params[id][i], bound)
            << what << ": key bias " << l << "[" << i << "]";
        masked.params[id][i] = ref.params[id][i];
      }
    }
  }
  return masked;
}

// The parameter tolerance (atol, rtol): the GPT's, or with bf16 compute the chains'
// 16-bit one (engine_model_checks.h: a flipped rounding of a compute copy moves an
// element by up to an Adam step per step).
inline std::pair<double, double> GptParamTolerance(bool bf16) {
  return bf16 ? std::pair{kChain16Atol, 0.0} : std::pair{kGptAtol, kGptRtol};
}

// ExpectChainMatches with the GPT's parameter tolerance.
inline void ExpectGptMatches(const ChainRun& run, const ChainRun& ref, bool bf16, const std::string& what) {
  ASSERT_TRUE(run.status.ok()) << what << ": " << run.status.ToString();
  ASSERT_EQ(run.losses.size(), ref.losses.size()) << what;
  const double loss_rtol = bf16 ? kChain16LossRtol : kChainLossRtol;
  const double norm_rtol = bf16 ? kChain16NormRtol : kChainNormRtol;
  for (size_t i = 0; i < ref.losses.size(); ++i) {
    EXPECT_NEAR(run.losses[i], ref.losses[i], loss_rtol * std::fabs(ref.losses[i])) << what << ": loss " << i;
    EXPECT_NEAR(run.grad_norms[i], ref.grad_norms[i], norm_rtol * ref.grad_norms[i])
        << what << ": norm " << i;
    EXPECT_NEAR(run.clip_coefs[i], ref.clip_coefs[i], norm_rtol * ref.clip_coefs[i])
        << what << ": clip " << i;
  }
  const auto [atol, rtol] = GptParamTolerance(bf16);
  const double err = ChainParamError(run, ref, atol, rtol);
  EXPECT_LE(err, 1.0) << what << ": final parameters differ from the reference (error " << err
                      << " x tolerance)";
  EXPECT_LE(run.device_high_water, run.device_capacity) << what;
}

// Where ChainParamError's worst element is: "name[i] engine vs reference".
inline std::string WorstParam(const ChainRun& run, const ChainRun& ref, const ModelDecl& model, bool bf16) {
  const auto [atol, rtol] = GptParamTolerance(bf16);
  double worst = -1;
  std::string where;
  for (size_t t = 0; t < ref.params.size() && t < run.params.size(); ++t) {
    for (size_t i = 0; i < ref.params[t].size() && i < run.params[t].size(); ++i) {
      const double a = run.params[t][i], b = ref.params[t][i];
      const double err = std::fabs(a - b) / (atol + rtol * std::fabs(b));
      if (err > worst) {
        worst = err;
        where = model.tensors[t].name + "[" + std::to_string(i) + "] " + std::to_string(a) + " vs " +
                std::to_string(b);
      }
    }
  }
  return where;
}

// Trains every variant with every combo and compares each with the variant's reference.
// Returns the references; prints the worst parameter error (in tolerances) and the time.
inline std::vector<ChainRun> CheckGptVariants(Communicator& world, const std::vector<GptVariant>& variants,
                                              const std::vector<Combo>& combos) {
  std::vector<ChainRun> refs;
  const auto t0 = std::chrono::steady_clock::now();
  for (const GptVariant& var : variants) {
    refs.push_back(
        TrainGptReference(MakeConfig({0, "none", "none"}, var.extra_json), var.setup, world.size()));
    const ChainRun& ref = refs.back();
    EXPECT_TRUE(ref.status.ok()) << var.name << ": " << ref.status.ToString();
    if (!ref.status.ok()) continue;
    for (double l : ref.losses) EXPECT_TRUE(std::isfinite(l)) << var.name << ": the reference lost its way";
    double worst = 0;
    std::string where;
    int min_chunks = 1 << 30;
    const bool bf16 = MakeConfig({0, "none", "none"}, var.extra_json).bf16;
    const auto [atol, rtol] = GptParamTolerance(bf16);
    for (const Combo& c : combos) {
      const std::string what = var.name + " " + ComboName(c) + " world " + std::to_string(world.size());
      const ChainRun run =
          CheckKeyBias(RunGptEngine(world, MakeConfig(c, var.extra_json), var.setup), ref, var, what);
      ExpectGptMatches(run, ref, bf16, what);
      if (!run.status.ok()) continue;
      // A tied head is one parameter: the engine holds exactly the real parameters.
      EXPECT_EQ(run.layout.num_params, model::GptParameterCount(var.setup.spec)) << what;
      const double err = ChainParamError(run, ref, atol, rtol);
      if (err > worst) where = WorstParam(run, ref, model::GptModel(var.setup.spec), bf16);
      worst = std::max(worst, err);
      min_chunks = std::min(min_chunks, run.layout.num_chunks);
      // A tensor more than a chunk takes a run of chunks; else the chunk is its size.
      const int64_t widest = var.setup.spec.vocab_size * var.setup.spec.n_embd;
      EXPECT_EQ(run.layout.run_chunks > 0, widest > run.layout.chunk_elems) << what;
    }
    EXPECT_GE(min_chunks, 2) << var.name << ": the model must span several chunks";
    if (world.rank() == 0) {
      std::printf("%s: worst parameter error %.3f x tolerance (%s), >= %d chunks, loss %.4f -> %.4f\n",
                  var.name.c_str(), worst, where.c_str(), min_chunks, ref.losses.front(), ref.losses.back());
    }
  }
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (world.rank() == 0)
    std::printf("%zu variants x %zu combos: %.1f s\n", variants.size(), combos.size(), s);
  return refs;
}

// The variants every world size checks: a tiny GPT (vocab 64, block 16, 2 layers, 2 heads,
// n_embd 32; 28k parameters) with chunks of 8 KiB raised to its largest module (~8.4k
// elements), so that it spans several chunks and modules share them.
inline std::vector<GptVariant> GptVariants() {
  const model::GptSpec tied{64, 16, 2, 2, 32, /*tied_head=*/true, /*seed=*/7};
  model::GptSpec untied = tied;
  untied.tied_head = false;
  const std::string chunks = R"({"strata": {"chunk_size": "8KiB"})";
  GptSetup recompute{tied};
  recompute.recompute = true;
  // A vocabulary of 2048 x 32: the token embedding (and the tied head) are more than 4x
  // the blocks, so the embedding takes a run of chunks instead of setting their size.
  // Seed 7 at world 4 leaves one weight whose gradient sums to nearly zero, where Adam
  // turns the all-reduce's other rounding into 1.4x the tolerance with or without runs
  // (the same error with a 1 MiB chunk that holds the embedding whole): seed 3 has none.
  const model::GptSpec large_vocab{2048, 16, 4, 2, 32, /*tied_head=*/true, /*seed=*/3};
  return {
      {"tied", chunks + "}", {tied}},
      // The gradient norm is 0.6-1.1 over the steps: 0.5 clips every one.
      {"tied, accumulation 2, clipping",
       chunks + R"(, "gradient_accumulation_steps": 2, "gradient_clipping": 0.5})",
       {tied}},
      {"tied, recompute", chunks + "}", recompute},
      {"untied", chunks + "}", {untied}},
      // bf16 compute copies (the masters, Adam and every gradient stay fp32).
      {"tied, bf16, accumulation 2, clipping",
       chunks + R"(, "bf16": {"enabled": true}, "gradient_accumulation_steps": 2, "gradient_clipping": 0.5})",
       {tied}},
      {"tied, a vocabulary larger than a chunk",
       chunks + R"(, "gradient_accumulation_steps": 2})",
       {large_vocab}},
  };
}

}  // namespace strata::testing
