// strata._strata.Engine: the ZeRO engine for a model declared from Python (strata.torch).
//
// The Python side declares tensors by id and modules as lists of ids (module_hooks.h),
// calls fetch/release around each module's forward and hands gradients in with
// accumulate_grad as torch's autograd produces them. Parameters live in the engine:
// fetch returns DLPack views of its compute copies (kept alive by the engine object),
// which the Python side makes the torch parameters' data. The engine runs on the sim
// device (host memory), so the views are CPU tensors.
//
// The world communicator is MPI's (one process without mpirun, or every rank under
// mpirun); it is made with the first engine and ended by finalize_world() once no
// engine is left.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "module.h"
#include "ndarray_util.h"
#include "status_py.h"
#include "strata/checkpoint.h"
#include "strata/comm.h"
#include "strata/config.h"
#include "strata/device.h"
#include "strata/engine.h"

namespace nb = nanobind;

namespace strata::py {
namespace {

using CpuArray = nb::ndarray<nb::device::cpu>;

// The world, shared by every engine of the process.
std::shared_ptr<Communicator>& World() {
  static std::shared_ptr<Communicator> world;
  return world;
}

std::shared_ptr<Communicator> GetWorld() {
  if (!World()) {
    auto w = InitWorld(CommOptions{"world", 300});
    if (!w.ok()) RaiseStatus(w.status(), "strata.torch: starting MPI");
    World() = std::shared_ptr<Communicator>(std::move(*w));
  }
  return World();
}

nb::dlpack::dtype DlpackOf(DType t) {
  switch (t) {
    case DType::kF32: return nb::dtype<float>();
    case DType::kBf16: return {static_cast<uint8_t>(nb::dlpack::dtype_code::Bfloat), 16, 1};
    case DType::kFp16: break;
  }
  return {static_cast<uint8_t>(nb::dlpack::dtype_code::Float), 16, 1};
}

Result<DType> GradType(const CpuArray& a) {
  if (a.dtype() == nb::dtype<float>()) return DType::kF32;
  if (a.dtype() == DlpackOf(DType::kBf16)) return DType::kBf16;
  if (a.dtype() == DlpackOf(DType::kFp16)) return DType::kFp16;
  return InvalidArgumentError("gradients must be float32, bfloat16 or float16");
}

class PyEngine {
 public:
  PyEngine(const std::string& config_json, std::vector<std::string> names,
           std::vector<std::vector<int64_t>> shapes, std::vector<std::string> module_names,
           std::vector<std::vector<int>> module_tensors, std::vector<CpuArray> init) {
    if (names.size() != shapes.size() || names.size() != init.size() ||
        module_names.size() != module_tensors.size()) {
      RaiseValueError("strata.Engine: names, shapes and initial values must be given for every tensor");
    }
    for (size_t i = 0; i < names.size(); ++i) model_.tensors.push_back({names[i], shapes[i], std::nullopt});
    for (size_t m = 0; m < module_names.size(); ++m)
      model_.modules.push_back({module_names[m], module_tensors[m]});
    Status valid = ValidateModel(model_);
    if (!valid.ok()) RaiseStatus(valid, "strata.Engine");
    for (size_t i = 0; i < init.size(); ++i) {
      if (init[i].dtype() != nb::dtype<float>() || !IsContiguous(init[i]) ||
          static_cast<int64_t>(init[i].size()) != model_.tensors[i].numel()) {
        RaiseValueError("strata.Engine: the initial value of \"" + names[i] +
                        "\" must be a contiguous float32 array of its shape");
      }
    }
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(config_json);
    } catch (const std::exception& e) {
      RaiseValueError(std::string("strata.Engine: the config is not JSON: ") + e.what());
    }
    auto config = ParseConfig(j);
    if (!config.ok()) RaiseStatus(config.status(), "strata.Engine: config");
    config_ = *config;
    world_ = GetWorld();
    DeviceOptions dopt;
    dopt.kind = DeviceKind::kSim;
    dopt.capacity = config_.strata.device_budget;
    auto dev = CreateDevice(dopt);
    if (!dev.ok()) RaiseStatus(dev.status(), "strata.Engine: device");
    device_ = std::move(*dev);
    ParamInit fill = [&init](TensorId id, int64_t begin, int64_t count, float* out) {
      const float* src = static_cast<const float*>(init[id].data()) + begin;
      std::copy(src, src + count, out);
    };
    Result<std::unique_ptr<Engine>> engine = OkStatus();
    {
      nb::gil_scoped_release release;  // collective over the ranks
      engine = Engine::Create(config_, model_, fill, EngineResources{world_.get(), device_.get()});
    }
    if (!engine.ok()) RaiseStatus(engine.status(), "strata.Engine");
    engine_ = std::move(*engine);
  }

  // Views of the module's compute parameters, valid until release(module) (stages 0-2:
  // for the engine's life; stage 3: the gathered chunks, which the release may refill).
  nb::list Fetch(nb::handle self, int module) {
    Engine& e = Live();
    Result<ModuleParams> p = OkStatus();
    {
      nb::gil_scoped_release release;
      p = e.Fetch(module);
    }
    if (!p.ok()) RaiseStatus(p.status(), "strata.Engine.fetch");
    nb::list views;
    const std::vector<TensorId>& ids = model_.modules.at(module).tensors;
    for (size_t i = 0; i < ids.size(); ++i) {
      const std::vector<int64_t>& shape = model_.tensors[ids[i]].shape;
      std::vector<size_t> dims(shape.begin(), shape.end());
      views.append(nb::ndarray<nb::pytorch>(const_cast<void*>(p->tensors[i]), dims.size(), dims.data(), self,
                                            nullptr, DlpackOf(p->dtype))
                       .cast());
    }
    return views;
  }

  void Release(int module) { Check(Live().Release(module), "release"); }

  void AccumulateGrad(int tensor, const CpuArray& grad) {
    Result<DType> type = GradType(grad);
    if (!type.ok()) RaiseStatus(type.status(), "strata.Engine.accumulate_grad");
    if (tensor < 0 || tensor >= static_cast<int>(model_.tensors.size()) || !IsContiguous(grad) ||
        static_cast<int64_t>(grad.size()) != model_.tensors[tensor].numel()) {
      RaiseValueError("strata.Engine.accumulate_grad: tensor " + std::to_string(tensor) +
                      " takes a contiguous gradient of its own shape");
    }
    Engine& e = Live();
    Status st;
    {
      nb::gil_scoped_release release;
      st = e.AccumulateGrad(tensor, grad.data(), *type);
    }
    Check(st, "accumulate_grad");
  }

  void BeginMicroBatch() { Check(Live().BeginMicroBatch(), "begin_micro_batch"); }
  void SetEvaluating(bool on) { Check(Live().SetEvaluating(on), "set_evaluating"); }

  nb::dict Step() {
    Engine& e = Live();
    Result<StepResult> r = OkStatus();
    {
      nb::gil_scoped_release release;
      r = e.Step();
    }
    if (!r.ok()) RaiseStatus(r.status(), "strata.Engine.step");
    nb::dict d;
    d["skipped"] = r->skipped;
    d["loss_scale"] = r->loss_scale;
    d["grad_norm"] = r->grad_norm;
    d["clip_coef"] = r->clip_coef;
    d["speculative_steps"] = r->speculative_steps;
    d["bytes_nvme_read"] = r->bytes_nvme_read;
    d["bytes_nvme_written"] = r->bytes_nvme_written;
    return d;
  }

  // The fp32 master of a tensor, gathered from every rank (collective), as a new array.
  nb::object GatherMaster(int tensor) {
    Engine& e = Live();
    auto* values = new std::vector<float>();
    Status st;
    {
      nb::gil_scoped_release release;
      st = e.Flush();
      if (st.ok()) st = e.GatherMaster(tensor, values);
    }
    if (!st.ok()) {
      delete values;
      RaiseStatus(st, "strata.Engine.gather_master");
    }
    nb::capsule owner(values, [](void* p) noexcept { delete static_cast<std::vector<float>*>(p); });
    const std::vector<int64_t>& shape = model_.tensors.at(tensor).shape;
    std::vector<size_t> dims(shape.begin(), shape.end());
    return nb::ndarray<nb::pytorch, float>(values->data(), dims.size(), dims.data(), owner).cast();
  }

  // Engine::SaveCheckpoint into `dir` (collective), with the caller's JSON state.
  void SaveCheckpoint(const std::string& dir, const std::string& client_json) {
    Engine& e = Live();
    Status st;
    {
      nb::gil_scoped_release release;
      st = e.SaveCheckpoint(dir, CheckpointMeta{.json = client_json});
    }
    if (!st.ok()) RaiseStatus(st, "strata.Engine.save_checkpoint(" + dir + ")", dir);
  }

  // Engine::StartCheckpoint (collective): returns once the save knows where every block
  // is; a worker writes the files while training goes on.
  void StartCheckpoint(const std::string& dir, const std::string& client_json) {
    Engine& e = Live();
    Status st;
    {
      nb::gil_scoped_release release;  // Flush() and the ranks' agreement wait
      st = e.StartCheckpoint(dir, CheckpointMeta{.json = client_json});
    }
    if (!st.ok()) RaiseStatus(st, "strata.Engine.start_checkpoint(" + dir + ")", dir);
    pending_dir_ = dir;
  }

  // Engine::FinishCheckpoint (collective): waits for the files, then publishes the
  // directory; a failure names it, since the save it belongs to was started earlier.
  nb::dict FinishCheckpoint() {
    Engine& e = Live();
    const std::string dir = std::exchange(pending_dir_, std::string());
    Result<CheckpointTimes> t = OkStatus();
    {
      nb::gil_scoped_release release;
      t = e.FinishCheckpoint();
    }
    if (!t.ok()) RaiseStatus(t.status(), "strata.Engine.finish_checkpoint(" + dir + ")", dir);
    nb::dict d;
    d["started_s"] = t->started_s;
    d["finish_wait_s"] = t->finish_wait_s;
    d["optimizer_wait_s"] = t->optimizer_wait_s;
    d["total_s"] = t->total_s;
    d["stalled_s"] = t->stalled_s();
    return d;
  }

  bool checkpoint_in_progress() const { return Live().checkpoint_in_progress(); }

  // Engine::LoadCheckpoint (collective): (the caller's JSON state, Step() calls of the
  // saved run, optimizer steps of those).
  nb::tuple LoadCheckpoint(const std::string& dir) {
    Engine& e = Live();
    CheckpointMeta meta;
    Status st;
    {
      nb::gil_scoped_release release;
      st = e.LoadCheckpoint(dir, &meta);
    }
    Check(st, "load_checkpoint");
    return nb::make_tuple(meta.json, meta.step_calls, meta.optimizer_steps);
  }

  double learning_rate() const { return Live().learning_rate(); }
  void set_learning_rate(double lr) { Check(Live().SetLearningRate(lr), "lr"); }

  double loss_scale() const { return Live().loss_scale(); }
  int rank() const { return (Live(), world_->rank()); }
  int world_size() const { return (Live(), world_->size()); }
  int stage() const { return config_.zero.stage; }
  // The layout: its chunks, and those held by tensors larger than a chunk (runs).
  int num_chunks() { return Live().layout_info().num_chunks; }
  int run_chunks() { return Live().layout_info().run_chunks; }
  int gradient_accumulation_steps() const { return config_.gradient_accumulation_steps; }
  int64_t micro_batch_size() const { return config_.train_micro_batch_size_per_gpu; }

  // Ends the engine before Python drops it: its destructor waits for what is in flight
  // (a micro-batch left open, after an error, is dropped with it).
  void Close() {
    if (!engine_) return;
    {
      nb::gil_scoped_release release;
      engine_.reset();
    }
    device_.reset();
    world_.reset();  // MPI ends (finalize_world) once no engine holds the world
  }

 private:
  // The engine, or RuntimeError once close() ended it.
  Engine& Live() const {
    if (!engine_) RaiseStatus(FailedPreconditionError("the engine was closed"), "strata.Engine");
    return *engine_;
  }
  void Check(const Status& st, const char* call) const {
    if (!st.ok()) RaiseStatus(st, std::string("strata.Engine.") + call);
  }

  ModelDecl model_;
  Config config_;
  std::shared_ptr<Communicator> world_;
  std::unique_ptr<Device> device_;
  std::unique_ptr<Engine> engine_;
  std::string pending_dir_;  // of the save StartCheckpoint began, for FinishCheckpoint's errors
};

void FinalizeWorldIfIdle() {
  if (!World()) return;
  if (World().use_count() > 1) return;  // an engine still holds it
  World().reset();
  Status st = FinalizeWorld();
  if (!st.ok()) RaiseStatus(st, "strata: ending MPI");
}

}  // namespace

void BindEngine(nb::module_& m) {
  nb::class_<PyEngine>(m, "Engine")
      .def(nb::init<const std::string&, std::vector<std::string>, std::vector<std::vector<int64_t>>,
                    std::vector<std::string>, std::vector<std::vector<int>>, std::vector<CpuArray>>(),
           nb::arg("config_json"), nb::arg("names"), nb::arg("shapes"), nb::arg("module_names"),
           nb::arg("module_tensors"), nb::arg("init"))
      .def(
          "fetch", [](nb::handle self, int module) { return nb::cast<PyEngine&>(self).Fetch(self, module); },
          nb::arg("module"))
      .def("release", &PyEngine::Release, nb::arg("module"))
      .def("accumulate_grad", &PyEngine::AccumulateGrad, nb::arg("tensor"), nb::arg("grad"))
      .def("begin_micro_batch", &PyEngine::BeginMicroBatch)
      .def("set_evaluating", &PyEngine::SetEvaluating)
      .def("step", &PyEngine::Step)
      .def("gather_master", &PyEngine::GatherMaster, nb::arg("tensor"))
      .def("save_checkpoint", &PyEngine::SaveCheckpoint, nb::arg("dir"), nb::arg("client_json"))
      .def("start_checkpoint", &PyEngine::StartCheckpoint, nb::arg("dir"), nb::arg("client_json"))
      .def("finish_checkpoint", &PyEngine::FinishCheckpoint)
      .def_prop_ro("checkpoint_in_progress", &PyEngine::checkpoint_in_progress)
      .def("load_checkpoint", &PyEngine::LoadCheckpoint, nb::arg("dir"))
      .def_prop_rw("lr", &PyEngine::learning_rate, &PyEngine::set_learning_rate)
      .def("close", &PyEngine::Close)
      .def_prop_ro("loss_scale", &PyEngine::loss_scale)
      .def_prop_ro("rank", &PyEngine::rank)
      .def_prop_ro("world_size", &PyEngine::world_size)
      .def_prop_ro("stage", &PyEngine::stage)
      .def_prop_ro("num_chunks", &PyEngine::num_chunks)
      .def_prop_ro("run_chunks", &PyEngine::run_chunks)
      .def_prop_ro("gradient_accumulation_steps", &PyEngine::gradient_accumulation_steps)
      .def_prop_ro("micro_batch_size", &PyEngine::micro_batch_size);
  m.def("finalize_world", &FinalizeWorldIfIdle,
        "Ends MPI once no engine is left (strata.torch calls it at exit).");
}

}  // namespace strata::py
