// Start-up check that every rank runs with rank 0's configuration and model layout:
// a mismatch found here names the key; found later it would be a hang or wrong sums.
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "strata/comm.h"

namespace strata {
namespace {

uint64_t Fnv1a64(std::string_view s) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : s) {
    h ^= c;
    h *= 1099511628211ull;
  }
  return h;
}

std::string Short(const nlohmann::json& v) {
  std::string s = v.dump();
  return s.size() > 80 ? s.substr(0, 77) + "..." : s;
}

// First key path (in sorted key order, arrays by index) where `a` and `b` differ.
bool FirstDifference(const nlohmann::json& a, const nlohmann::json& b, const std::string& path, std::string* where,
                     std::string* va, std::string* vb) {
  if (a.is_object() && b.is_object()) {
    auto ia = a.begin(), ib = b.begin();  // nlohmann::json objects iterate in key order
    while (ia != a.end() || ib != b.end()) {
      if (ib == b.end() || (ia != a.end() && ia.key() < ib.key())) {
        *where = path.empty() ? ia.key() : path + "." + ia.key();
        *va = Short(*ia);
        *vb = "(absent)";
        return true;
      }
      if (ia == a.end() || ib.key() < ia.key()) {
        *where = path.empty() ? ib.key() : path + "." + ib.key();
        *va = "(absent)";
        *vb = Short(*ib);
        return true;
      }
      if (FirstDifference(*ia, *ib, path.empty() ? ia.key() : path + "." + ia.key(), where, va, vb)) return true;
      ++ia;
      ++ib;
    }
    return false;
  }
  if (a.is_array() && b.is_array()) {
    for (size_t i = 0; i < a.size() && i < b.size(); ++i) {
      if (FirstDifference(a[i], b[i], path + "[" + std::to_string(i) + "]", where, va, vb)) return true;
    }
    if (a.size() != b.size()) {
      *where = path + " (length)";
      *va = std::to_string(a.size());
      *vb = std::to_string(b.size());
      return true;
    }
    return false;
  }
  if (a != b) {
    *where = path.empty() ? "(document)" : path;
    *va = Short(a);
    *vb = Short(b);
    return true;
  }
  return false;
}

// Broadcast of bytes; the host backend moves them untouched (MPI_BYTE underneath).
Status BroadcastString(Communicator& comm, std::string* s, int root) {
  uint64_t len = s->size();
  STRATA_RETURN_IF_ERROR(comm.Broadcast(&len, 4, DType::kFp16, root).Wait());
  std::vector<char> buf((len + 1) / 2 * 2, 0);
  if (comm.rank() == root) std::copy(s->begin(), s->end(), buf.begin());
  STRATA_RETURN_IF_ERROR(comm.Broadcast(buf.data(), buf.size() / 2, DType::kFp16, root).Wait());
  s->assign(buf.data(), len);
  return OkStatus();
}

}  // namespace

Status CheckConsistency(Communicator& comm, std::string_view what, const nlohmann::json& doc) {
  if (comm.memory_space() != MemorySpace::kHost) {
    return InvalidArgumentError("CheckConsistency: needs a host (MPI) communicator, got '" + comm.name() + "'");
  }
  const std::string mine = doc.dump();
  uint64_t hash = Fnv1a64(mine);
  uint64_t root_hash = hash;
  STRATA_RETURN_IF_ERROR(comm.Broadcast(&root_hash, 4, DType::kFp16, 0).Wait());
  // One flag per rank; a float sum of 0/1 values is exact.
  std::vector<float> differs(static_cast<size_t>(comm.size()), 0.0f);
  differs[static_cast<size_t>(comm.rank())] = hash != root_hash ? 1.0f : 0.0f;
  STRATA_RETURN_IF_ERROR(
      comm.AllReduce(differs.data(), differs.data(), differs.size(), DType::kF32, ReduceOp::kSum).Wait());
  int first = -1, count = 0;
  for (int r = 0; r < comm.size(); ++r) {
    if (differs[static_cast<size_t>(r)] != 0.0f) {
      if (first < 0) first = r;
      ++count;
    }
  }
  if (first < 0) return OkStatus();
  std::string root_doc = comm.rank() == 0 ? mine : std::string();
  STRATA_RETURN_IF_ERROR(BroadcastString(comm, &root_doc, 0));
  std::string detail;
  if (comm.rank() == first) {
    std::string where, v_first, v_root;
    nlohmann::json root_json = nlohmann::json::parse(root_doc, nullptr, /*allow_exceptions=*/false);
    if (root_json.is_discarded() ||
        !FirstDifference(doc, root_json, "", &where, &v_first, &v_root)) {
      detail = "the documents differ in their text but not in their values";
    } else {
      detail = "rank " + std::to_string(first) + " has " + where + " = " + v_first + ", rank 0 has " + v_root;
    }
  }
  STRATA_RETURN_IF_ERROR(BroadcastString(comm, &detail, first));
  return InvalidArgumentError(std::string(what) + " mismatch between ranks on communicator '" + comm.name() +
                              "': " + detail + " (" + std::to_string(count) + " of " + std::to_string(comm.size()) +
                              " ranks differ from rank 0); start every rank with the same " + std::string(what));
}

}  // namespace strata
