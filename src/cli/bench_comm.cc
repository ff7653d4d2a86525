// `strata bench comm`: collectives through strata's Communicator, with algorithm and
// bus bandwidth per operation and size (nccl-tests' definitions: size is the full
// buffer; busbw = algbw x (n-1)/n for all-gather and reduce-scatter, x 2(n-1)/n for
// all-reduce, x 1 for broadcast), host buffers (MPI backend) and, where a GPU is
// present, device buffers (NCCL backend). Beside each host figure: the same operation
// called directly on MPI in the same run (MPI_Allgather, MPI_Reduce_scatter_block,
// MPI_Allreduce, MPI_Bcast) and the ratio. Each figure is the median of --repeats runs,
// communicator and raw MPI interleaved (alternating which goes first), with the same
// buffers, iteration count and warm-up; buffers are allocated and touched once.
//
// Run: mpirun -np 2 --bind-to none strata bench comm   (or without mpirun: 1 rank)
#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <functional>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <vector>

#include "cli/commands.h"
#include "cli/table.h"
#include "comm/raw_mpi.h"
#include "strata/comm.h"
#include "strata/units.h"

namespace strata::cli {
namespace {

using nlohmann::json;

struct CommBenchOptions {
  std::vector<std::string> sizes = {"64KiB", "1MiB", "16MiB", "64MiB"};
  std::vector<std::string> ops = {"allgather", "reducescatter", "allreduce", "broadcast"};
  std::vector<std::string> dtypes = {"f32", "bf16"};
  int repeats = 5;
  double seconds = 0.05;  // target time per measured run (iterations chosen from it)
  bool device = true;
  bool json = false;
};

enum class Op { kAllGather, kReduceScatter, kAllReduce, kBroadcast };

struct Row {
  std::string space;  // host | device
  std::string op;
  std::string dtype;
  uint64_t bytes = 0;
  int iters = 0;
  double time_s = 0;  // per operation, median
  double algbw = 0;   // bytes/s
  double busbw = 0;
  double raw_time_s = 0;  // host only
  double raw_busbw = 0;
};

double Now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

double BusFactor(Op op, int n) {
  switch (op) {
    case Op::kAllGather:
    case Op::kReduceScatter: return static_cast<double>(n - 1) / n;
    case Op::kAllReduce: return 2.0 * (n - 1) / n;
    case Op::kBroadcast: return 1.0;
  }
  return 1.0;
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

Result<Op> ParseOp(const std::string& s) {
  if (s == "allgather") return Op::kAllGather;
  if (s == "reducescatter") return Op::kReduceScatter;
  if (s == "allreduce") return Op::kAllReduce;
  if (s == "broadcast") return Op::kBroadcast;
  return InvalidArgumentError("--ops: unknown operation '" + s +
                              "' (allgather|reducescatter|allreduce|broadcast)");
}

Result<DType> ParseDType(const std::string& s) {
  if (s == "f32") return DType::kF32;
  if (s == "bf16") return DType::kBf16;
  if (s == "fp16") return DType::kFp16;
  return InvalidArgumentError("--dtypes: unknown dtype '" + s + "' (f32|bf16|fp16)");
}

// Counts for a full-buffer size of `bytes` (per rank for AllGather/ReduceScatter).
size_t CountFor(Op op, uint64_t bytes, DType d, int n) {
  size_t elems = bytes / DTypeSize(d);
  return (op == Op::kAllGather || op == Op::kReduceScatter) ? elems / static_cast<size_t>(n) : elems;
}

CommHandle Issue(Communicator& c, Op op, void* send, void* recv, size_t count, DType d) {
  switch (op) {
    case Op::kAllGather: return c.AllGather(send, recv, count, d);
    case Op::kReduceScatter: return c.ReduceScatter(send, recv, count, d, ReduceOp::kSum);
    case Op::kAllReduce: return c.AllReduce(send, recv, count, d, ReduceOp::kSum);
    case Op::kBroadcast: break;
  }
  return c.Broadcast(recv, count, d, 0);
}

// Averages a double over ranks (as nccl-tests averages its times).
Result<double> AverageOverRanks(Communicator& host, double t) {
  float v = static_cast<float>(t);
  STRATA_RETURN_IF_ERROR(host.AllReduce(&v, &v, 1, DType::kF32, ReduceOp::kAvg).Wait());
  return static_cast<double>(v);
}

Status RunSpace(Communicator& c, Communicator& host, bool raw, const CommBenchOptions& o,
                std::vector<Row>* rows) {
  const int n = c.size();
  std::vector<uint64_t> sizes;
  for (const std::string& s : o.sizes) {
    STRATA_ASSIGN_OR_RETURN(uint64_t b, ParseBytes(s));
    sizes.push_back(b);
  }
  uint64_t largest = *std::max_element(sizes.begin(), sizes.end());
  // Allocated and touched once, reused by every size.
  std::vector<float> ones(largest / 4 + 16, 1.0f);
  STRATA_ASSIGN_OR_RETURN(void* send, c.AllocateBuffer(largest + 64));
  STRATA_ASSIGN_OR_RETURN(void* recv, c.AllocateBuffer(largest + 64));
  std::unique_ptr<void, std::function<void(void*)>> free_send(send, [&](void* p) { c.FreeBuffer(p); });
  std::unique_ptr<void, std::function<void(void*)>> free_recv(recv, [&](void* p) { c.FreeBuffer(p); });
  if (c.memory_space() ==
      MemorySpace::kHost) {  // bf16/fp16 1.0 is not 0x3f800000, but any finite value will do
    std::memcpy(send, ones.data(), largest);
    std::memcpy(recv, ones.data(), largest);
  } else {
    // Device buffers: content does not matter for timing; a copy would need CUDA here.
  }
  for (const std::string& op_name : o.ops) {
    STRATA_ASSIGN_OR_RETURN(Op op, ParseOp(op_name));
    for (const std::string& dt : o.dtypes) {
      STRATA_ASSIGN_OR_RETURN(DType d, ParseDType(dt));
      for (uint64_t bytes : sizes) {
        size_t count = CountFor(op, bytes, d, n);
        uint64_t full = (op == Op::kAllGather || op == Op::kReduceScatter) ? count * DTypeSize(d) * n
                                                                           : count * DTypeSize(d);
        if (count == 0) continue;
        const comm::RawOp rop = op == Op::kAllGather       ? comm::RawOp::kAllGather
                                : op == Op::kReduceScatter ? comm::RawOp::kReduceScatter
                                : op == Op::kAllReduce     ? comm::RawOp::kAllReduce
                                                           : comm::RawOp::kBroadcast;
        // One untimed call of each first; then iterations for about o.seconds, from one
        // timed call (agreed across ranks).
        if (raw) STRATA_RETURN_IF_ERROR(comm::TimeRawMpi(c, rop, send, recv, count, d, 1).status());
        STRATA_RETURN_IF_ERROR(Issue(c, op, send, recv, count, d).Wait());
        double t0 = Now();
        STRATA_RETURN_IF_ERROR(Issue(c, op, send, recv, count, d).Wait());
        STRATA_ASSIGN_OR_RETURN(double one, AverageOverRanks(host, Now() - t0));
        float it = static_cast<float>(std::clamp(o.seconds / std::max(one, 1e-7), 3.0, 2000.0));
        STRATA_RETURN_IF_ERROR(host.Broadcast(&it, 1, DType::kF32, 0).Wait());
        const int iters = static_cast<int>(it);
        std::vector<double> comm_t, raw_t;
        auto time_comm = [&]() -> Status {
          STRATA_RETURN_IF_ERROR(c.Barrier().Wait());
          double s0 = Now();
          for (int i = 0; i < iters; ++i) STRATA_RETURN_IF_ERROR(Issue(c, op, send, recv, count, d).Wait());
          STRATA_ASSIGN_OR_RETURN(double ct, AverageOverRanks(host, (Now() - s0) / iters));
          comm_t.push_back(ct);
          return OkStatus();
        };
        auto time_raw = [&]() -> Status {
          STRATA_ASSIGN_OR_RETURN(double rt, comm::TimeRawMpi(c, rop, send, recv, count, d, iters));
          STRATA_ASSIGN_OR_RETURN(double rta, AverageOverRanks(host, rt / iters));
          raw_t.push_back(rta);
          return OkStatus();
        };
        for (int r = 0; r < o.repeats; ++r) {
          // Which goes first alternates, so that neither always runs on caches and
          // clocks the other left behind.
          if (raw && r % 2 == 1) STRATA_RETURN_IF_ERROR(time_raw());
          STRATA_RETURN_IF_ERROR(time_comm());
          if (raw && r % 2 == 0) STRATA_RETURN_IF_ERROR(time_raw());
        }
        Row row;
        row.space = c.memory_space() == MemorySpace::kHost ? "host" : "device";
        row.op = op_name;
        row.dtype = dt;
        row.bytes = full;
        row.iters = iters;
        row.time_s = Median(comm_t);
        row.algbw = static_cast<double>(full) / row.time_s;
        row.busbw = row.algbw * BusFactor(op, n);
        if (raw) {
          row.raw_time_s = Median(raw_t);
          row.raw_busbw = static_cast<double>(full) / row.raw_time_s * BusFactor(op, n);
        }
        rows->push_back(row);
      }
    }
  }
  return OkStatus();
}

std::string Gbs(double bytes_per_s) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.2f", bytes_per_s / 1e9);
  return buf;
}

void Run(const CommBenchOptions& o) {
  CommOptions co;
  co.name = "bench";
  auto world = InitWorld(co);
  ThrowIfError(world.status());
  Communicator& host = **world;
  std::vector<Row> rows;
  ThrowIfError(RunSpace(host, host, /*raw=*/true, o, &rows));
  std::string device_note;
  if (o.device) {
    if (NcclAvailable()) {
      NcclOptions no;
      no.device = 0;  // one GPU per rank: the launcher's CUDA_VISIBLE_DEVICES picks it
      auto dev = CreateNcclCommunicator(host, no, co);
      ThrowIfError(dev.status());
      ThrowIfError(RunSpace(**dev, host, /*raw=*/false, o, &rows));
    } else {
      device_note = "device (NCCL): skipped, no GPU or no NCCL build";
    }
  }
  if (host.rank() == 0) {
    if (o.json) {
      json j;
      j["world_size"] = host.size();
      j["definitions"] =
          "nccl-tests: size = full buffer; busbw = algbw x (n-1)/n (allgather, reducescatter), "
          "x 2(n-1)/n (allreduce), x 1 (broadcast)";
      json arr = json::array();
      for (const Row& r : rows) {
        json e = {{"space", r.space},
                  {"op", r.op},
                  {"dtype", r.dtype},
                  {"bytes", r.bytes},
                  {"iters", r.iters},
                  {"time_s", r.time_s},
                  {"algbw_GBps", r.algbw / 1e9},
                  {"busbw_GBps", r.busbw / 1e9}};
        if (r.space == "host") {
          e["raw_mpi_time_s"] = r.raw_time_s;
          e["raw_mpi_busbw_GBps"] = r.raw_busbw / 1e9;
          e["ratio_vs_raw_mpi"] = r.time_s > 0 ? r.raw_time_s / r.time_s : 0;
        }
        arr.push_back(e);
      }
      j["results"] = arr;
      if (!device_note.empty()) j["device_note"] = device_note;
      std::cout << j.dump(2) << "\n";
    } else {
      std::printf(
          "strata bench comm: %d rank(s); nccl-tests definitions (size = full buffer; busbw = algbw x "
          "(n-1)/n for allgather/reducescatter, x 2(n-1)/n allreduce, x 1 broadcast)\n",
          host.size());
      Table t({"space", "op", "dtype", "size", "time", "algbw GB/s", "busbw GB/s", "raw MPI busbw", "ratio"});
      for (const Row& r : rows) {
        bool h = r.space == "host";
        char ratio[16];
        std::snprintf(ratio, sizeof(ratio), "%.2f", r.raw_time_s > 0 ? r.raw_time_s / r.time_s : 0.0);
        t.AddRow({r.space, r.op, r.dtype, FormatBytes(r.bytes), FormatSeconds(r.time_s), Gbs(r.algbw),
                  Gbs(r.busbw), h ? Gbs(r.raw_busbw) : "-", h ? ratio : "-"});
      }
      std::printf("%s", t.Render().c_str());
      std::printf("ratio = raw MPI time / Communicator time (>= 1: the Communicator is faster)\n");
      if (!device_note.empty()) std::printf("%s\n", device_note.c_str());
    }
  }
  world->reset();
  ThrowIfError(FinalizeWorld());
}

}  // namespace

void AddBenchCommCommand(CLI::App& bench) {
  auto o = std::make_shared<CommBenchOptions>();
  CLI::App* cmd = bench.add_subcommand(
      "comm",
      "collectives: Communicator vs raw MPI (host) and NCCL (device); run under `mpirun --bind-to none`");
  cmd->add_option("--sizes", o->sizes, "full-buffer sizes (nccl-tests' size)")->delimiter(',');
  cmd->add_option("--ops", o->ops, "allgather,reducescatter,allreduce,broadcast")->delimiter(',');
  cmd->add_option("--dtypes", o->dtypes, "f32,bf16,fp16")->delimiter(',');
  cmd->add_option("--repeats", o->repeats, "runs per figure (median)")->check(CLI::Range(1, 100));
  cmd->add_option("--seconds", o->seconds, "target seconds per run")->check(CLI::Range(0.001, 10.0));
  cmd->add_flag("!--no-device", o->device, "skip the NCCL (device) rows");
  cmd->add_flag("--json", o->json, "JSON output");
  cmd->callback([o] { Run(*o); });
}

}  // namespace strata::cli
