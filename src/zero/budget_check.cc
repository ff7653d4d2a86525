// Budget checks and the wording of their refusals (budget_check.h).
#include "zero/budget_check.h"

#include <sys/stat.h>
#include <sys/statvfs.h>

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <filesystem>
#include <map>

#include "strata/units.h"

namespace strata::zero {

std::string_view TierName(ZeroTier t) {
  switch (t) {
    case ZeroTier::kDevice: return "device";
    case ZeroTier::kHost: return "pinned host";
    case ZeroTier::kNvme: return "NVMe";
  }
  return "?";
}

namespace {

std::string_view PlaceName(ZeroTier t) {
  switch (t) {
    case ZeroTier::kDevice: return "on the device";
    case ZeroTier::kHost: return "in pinned host memory";
    case ZeroTier::kNvme: return "on NVMe";
  }
  return "?";
}

bool Below(ZeroTier a, ZeroTier b) { return static_cast<int>(a) > static_cast<int>(b); }

std::string Join(const std::vector<std::string>& items, const std::string& sep, const std::string& last_sep) {
  std::string out;
  for (size_t i = 0; i < items.size(); ++i) {
    if (i > 0) out += i + 1 == items.size() ? last_sep : sep;
    out += items[i];
  }
  return out;
}

// "a, 1.00 GiB; b, 512 MiB", largest first.
std::string PartsList(const TierNeed& need) {
  std::vector<NeedPart> parts = need.parts;
  std::stable_sort(parts.begin(), parts.end(),
                   [](const NeedPart& a, const NeedPart& b) { return a.bytes > b.bytes; });
  std::vector<std::string> items;
  for (const NeedPart& p : parts) items.push_back(p.what + ", " + FormatBytes(p.bytes));
  return Join(items, "; ", "; and ");
}

// Where the planes a memory tier no longer holds went, e.g. "the optimizer state and
// the parameter shards are already on NVMe"; "" when none went below `tier`.
std::string AlreadyMoved(const PlanShape& s, ZeroTier tier) {
  const bool opt = Below(s.opt_tier, tier) && !(s.opt_on_device_too && tier == ZeroTier::kDevice);
  const bool param = s.stage == 3 && Below(s.param_tier, tier);
  if (opt && param && s.opt_tier == s.param_tier) {
    return "the optimizer state and the parameter shards are already " + std::string(PlaceName(s.opt_tier));
  }
  std::vector<std::string> moved;
  if (opt) moved.push_back("the optimizer state is already " + std::string(PlaceName(s.opt_tier)));
  if (param) moved.push_back("the parameter shards are already " + std::string(PlaceName(s.param_tier)));
  return Join(moved, ", ", " and ");
}

void AddOnce(std::vector<std::string>& help, const std::string& item) {
  if (!item.empty() && std::find(help.begin(), help.end(), item) == help.end()) help.push_back(item);
}

// Levers of the parts of `scale`, and more ranks when sharded parts make up at least
// half of them.
void AddLevers(const TierNeed& need, NeedScale scale, const PlanShape& s, std::vector<std::string>& help) {
  uint64_t sharded = 0;
  for (const NeedPart& p : need.parts) {
    if (p.scale != scale) continue;
    AddOnce(help, p.lever);
    if (p.sharded) sharded += p.bytes;
  }
  if (2 * sharded >= need.Total(scale) && sharded > 0) {
    AddOnce(help, "spread it over more ranks (each holds 1/ranks of it; this run has " +
                      std::to_string(s.world_size) + ")");
  }
}

// A tier's need by what it grows with.
struct Shares {
  double model = 0, chunk = 0, fixed = 0;
  explicit Shares(const TierNeed& need) {
    model = static_cast<double>(need.Total(NeedScale::kModel));
    chunk = static_cast<double>(need.Total(NeedScale::kChunk));
    fixed = static_cast<double>(need.Total(NeedScale::kFixed));
  }
};

// How the chunks come about, for the message: "hold the largest module, 7.76K parameters".
std::string ChunkOrigin(const PlanShape& s) {
  const double size_elems = static_cast<double>(s.chunk_size / 4);
  if (size_elems <= static_cast<double>(s.largest_module)) {
    return "hold the largest module, " + FormatParams(static_cast<double>(s.largest_module)) + " parameters";
  }
  if (size_elems >= static_cast<double>(s.num_params)) {
    return "hold the whole model, " + FormatParams(static_cast<double>(s.chunk_elems)) +
           " parameters (strata.chunk_size " + FormatBytes(s.chunk_size) + " is larger)";
  }
  return "are strata.chunk_size, " + FormatBytes(s.chunk_size) + " (" +
         FormatParams(static_cast<double>(s.chunk_elems)) + " parameters)";
}

// What makes chunks of at most `fit` parameters.
void ChunkHelp(double fit, const PlanShape& s, std::vector<std::string>& help) {
  const bool chunk_from_size = static_cast<double>(s.chunk_size / 4) > static_cast<double>(s.largest_module);
  const uint64_t fit_bytes = static_cast<uint64_t>(fit * 4) / 4096 * 4096;
  const std::string size = fit_bytes >= 4096 ? FormatBytes(fit_bytes) : "";
  if (chunk_from_size && fit >= static_cast<double>(s.largest_module) && !size.empty()) {
    help.push_back("lower strata.chunk_size to at most " + size);
  } else {
    help.push_back("split the largest module (" + FormatParams(static_cast<double>(s.largest_module)) +
                   " parameters) into ones of at most about " + FormatParams(fit) +
                   " (a deeper, narrower model)" +
                   (chunk_from_size && !size.empty() ? " with strata.chunk_size at most " + size : ""));
  }
}

enum class Binding { kModel, kChunk, kBoth, kFixed };

// Which share binds, said in a sentence; the changes that would help go to `help`.
Binding Explain(const TierNeed& need, double budget, const PlanShape& s, std::string& m,
                std::vector<std::string>& help) {
  const Shares sh(need);
  const double params = static_cast<double>(s.num_params);
  const double per_elem = sh.chunk / static_cast<double>(s.chunk_elems);
  if (sh.fixed > budget) {
    // Said first, then what else must change once it is gone.
    TierNeed fixed{need.tier, {}}, rest{need.tier, {}};
    for (const NeedPart& p : need.parts) (p.scale == NeedScale::kFixed ? fixed : rest).Add(p);
    m += "Its fixed part alone (" + PartsList(fixed) + ") is more than that";
    AddLevers(need, NeedScale::kFixed, s, help);
    if (Shares(rest).model + Shares(rest).chunk + Shares(rest).fixed > budget) {
      m += ", and the rest does not fit either. ";
      Explain(rest, budget, s, m, help);
    } else {
      m += ".";
    }
    return Binding::kFixed;
  }
  if (sh.chunk + sh.fixed <= budget) {
    const double fit = (budget - sh.chunk - sh.fixed) / sh.model * params;
    m += "It grows with the model: at these settings it holds a model of at most about " + FormatParams(fit) +
         " parameters, and this one has " + FormatParams(params) + ".";
    AddLevers(need, NeedScale::kModel, s, help);
    help.push_back("a smaller model (at most about " + FormatParams(fit) + " parameters)");
    return Binding::kModel;
  }
  if (sh.model + sh.fixed < budget) {
    const double fit = (budget - sh.fixed - sh.model) / per_elem;
    m += "Most of it comes with the chunk, whatever the model's size: chunks here " + ChunkOrigin(s) +
         ", and at most about " + FormatParams(fit) + " fit.";
    ChunkHelp(fit, s, help);
    AddLevers(need, NeedScale::kChunk, s, help);
    return Binding::kChunk;
  }
  // Each share alone is too much: give each one's limit with the other near nothing.
  const double model_fit = (budget - sh.fixed) / sh.model * params;
  const double chunk_fit = (budget - sh.fixed) / per_elem;
  m += "Both what grows with the model (" + FormatBytes(static_cast<uint64_t>(sh.model)) +
       ") and what comes with each chunk (" + FormatBytes(static_cast<uint64_t>(sh.chunk)) +
       ") are too much on their own: even with tiny modules it holds at most about " +
       FormatParams(model_fit) + " parameters, and even for a tiny model chunks of at most about " +
       FormatParams(chunk_fit) + "; chunks here " + ChunkOrigin(s) + ".";
  AddLevers(need, NeedScale::kModel, s, help);
  ChunkHelp(chunk_fit, s, help);
  AddLevers(need, NeedScale::kChunk, s, help);
  help.push_back("a smaller model");
  return Binding::kBoth;
}

struct FileSystem {
  std::string dirs;  // the swap directories on it, for the message
  uint64_t free = 0;
  TierNeed need;
};

// The file system a swap directory will lie on: the nearest existing one of it and its
// parents (the store creates what is missing). False when none can be read.
bool FileSystemOf(const std::string& dir, dev_t* id, uint64_t* free) {
  std::error_code ec;
  std::filesystem::path p = std::filesystem::absolute(dir, ec);
  if (ec) return false;
  for (;; p = p.parent_path()) {
    struct stat st {};
    struct statvfs vfs {};
    if (::stat(p.c_str(), &st) == 0 && ::statvfs(p.c_str(), &vfs) == 0) {
      *id = st.st_dev;
      *free = static_cast<uint64_t>(vfs.f_bavail) * vfs.f_frsize;
      return true;
    }
    if (p == p.root_path() || p.empty()) return false;
  }
}

}  // namespace

uint64_t TierNeed::Total() const {
  uint64_t t = 0;
  for (const NeedPart& p : parts) t += p.bytes;
  return t;
}

uint64_t TierNeed::Total(NeedScale scale) const {
  uint64_t t = 0;
  for (const NeedPart& p : parts) t += p.scale == scale ? p.bytes : 0;
  return t;
}

std::string FormatParams(double params) {
  static constexpr const char* kSuffix[] = {"", "K", "M", "G", "T", "P"};
  int i = 0;
  while (params >= 999.5 && i < 5) {
    params /= 1000;
    ++i;
  }
  char buf[32];
  const char* format = i == 0 ? "%.0f%s" : params < 9.995 ? "%.2f%s" : params < 99.95 ? "%.1f%s" : "%.0f%s";
  std::snprintf(buf, sizeof buf, format, params, kSuffix[i]);
  return buf;
}

TierVerdict CheckTier(const TierNeed& need, const TierBudget& budget, const PlanShape& s) {
  TierVerdict v;
  const uint64_t total = need.Total();
  if (total <= budget.bytes) return v;
  v.fits = false;
  const std::string tier(TierName(need.tier));
  v.summary = "the " + tier + " tier is short too: it needs " + FormatBytes(total) + " and has " +
              FormatBytes(budget.bytes) + " (" + budget.source + ")";
  std::string m = "the " + tier + " tier cannot hold this configuration: it needs " + FormatBytes(total) +
                  " (" + PartsList(need) + ") and has " + FormatBytes(budget.bytes) + " (" + budget.source +
                  "). ";
  const double b = static_cast<double>(budget.bytes);
  std::vector<std::string> help;
  const Binding binding = Explain(need, b, s, m, help);
  bool model_levers = false;
  for (const NeedPart& p : need.parts) model_levers |= p.scale == NeedScale::kModel && !p.lever.empty();
  if (need.tier != ZeroTier::kNvme) {
    std::string moved = AlreadyMoved(s, need.tier);
    if (binding == Binding::kChunk || (binding == Binding::kBoth && !model_levers)) {
      m += " Offloading more does not help: these buffers stay on the " + tier + " wherever the state lives" +
           (moved.empty() ? "" : ", and " + moved) + ".";
    } else if (!moved.empty()) {
      moved[0] = static_cast<char>(std::toupper(static_cast<unsigned char>(moved[0])));
      m += " " + moved + ".";
    }
  }
  std::string raise = budget.raise;
  if (size_t at = raise.find("{need}"); at != std::string::npos) raise.replace(at, 6, FormatBytes(total));
  help.push_back(raise);
  v.message = m + " To fit: " + Join(help, "; ", "; or ") + ".";
  return v;
}

TierVerdict CheckNvme(const TierNeed& need, uint64_t nvme_budget, uint64_t stripe, const PlanShape& s) {
  if (need.Total() == 0) return {};
  if (nvme_budget > 0) {
    TierNeed budgeted = need;  // more disks do not raise a budget
    for (NeedPart& p : budgeted.parts) p.lever.clear();
    TierVerdict v = CheckTier(
        budgeted, {nvme_budget, "strata.nvme_budget", "raise strata.nvme_budget to at least {need}"}, s);
    if (!v.fits) return v;
  }
  // The free space of each file system, against the parts of the stores that lie on it.
  std::map<dev_t, FileSystem> systems;
  for (const NeedPart& part : need.parts) {
    const uint64_t n = part.paths.size();
    if (n == 0) continue;  // the store refuses a missing path itself
    const uint64_t share = ((part.bytes + n - 1) / n + stripe - 1) / stripe * stripe;
    for (const std::string& dir : part.paths) {
      dev_t id = 0;
      uint64_t free = 0;
      if (!FileSystemOf(dir, &id, &free)) continue;
      FileSystem& fs = systems[id];
      fs.free = free;
      fs.need.tier = ZeroTier::kNvme;
      if (fs.dirs.find(dir) == std::string::npos) fs.dirs += (fs.dirs.empty() ? "" : ", ") + dir;
      auto same = std::find_if(fs.need.parts.begin(), fs.need.parts.end(),
                               [&](const NeedPart& p) { return p.what == part.what; });
      if (same != fs.need.parts.end()) {
        same->bytes += share;
      } else {
        NeedPart p = part;
        p.bytes = share;
        fs.need.parts.push_back(p);
      }
    }
  }
  for (auto& [id, fs] : systems) {
    TierVerdict v = CheckTier(fs.need,
                              {fs.free,
                               "free space on the file system of " + fs.dirs +
                                   (nvme_budget ? "; strata.nvme_budget is " + FormatBytes(nvme_budget)
                                                : "; strata.nvme_budget unset"),
                               "free space there, or move the swap to a file system with {need} free"},
                              s);
    if (!v.fits) return v;
  }
  return {};
}

Status Refuse(const std::vector<const TierVerdict*>& in_order) {
  const TierVerdict* first = nullptr;
  std::vector<std::string> also;
  for (const TierVerdict* v : in_order) {
    if (v->fits) continue;
    if (first == nullptr)
      first = v;
    else
      also.push_back(v->summary);
  }
  if (first == nullptr) return OkStatus();
  std::string m = "engine: " + first->message;
  if (!also.empty()) m += " Also, " + Join(also, "; ", "; and ") + ".";
  return OutOfBudgetError(m);
}

}  // namespace strata::zero
