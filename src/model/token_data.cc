// Token files: the header, a validating mmap reader and deterministic batches (their
// preparation from text is token_prepare.cc).
#include "strata/token_data.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <system_error>
#include <utility>

namespace strata::model {

static_assert(std::endian::native == std::endian::little, "token files are little-endian");

namespace {

namespace fs = std::filesystem;

constexpr size_t kChecksumOffset = 56;
constexpr uint64_t kSampleStream = 0x746f6b656e730000ULL;  // separates batches from other hash uses

uint64_t Fnv1a64(const uint8_t* p, size_t n) {
  uint64_t h = 0xcbf29ce484222325ULL;
  for (size_t i = 0; i < n; ++i) h = (h ^ p[i]) * 0x100000001b3ULL;
  return h;
}

// SplitMix64 finaliser (as in model.cc): a well-mixed 64-bit bijection.
uint64_t Mix(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

template <typename T>
T Load(const uint8_t* p) {
  T v;
  std::memcpy(&v, p, sizeof(T));
  return v;
}

std::string Hex(const uint8_t* p, size_t n) {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string out;
  for (size_t i = 0; i < n; ++i) {
    out += kDigits[p[i] >> 4];
    out += kDigits[p[i] & 15];
  }
  return out;
}

// Header checks, in the order that names the most specific problem first: a file that is
// not a token file at all should not be reported as a checksum failure.
Status CheckHeader(const std::string& path, const uint8_t* p, uint64_t file_bytes, TokenFileHeader* out) {
  if (std::memcmp(p, kTokenFileMagic, sizeof(kTokenFileMagic)) != 0)
    return InvalidArgumentError("\"" + path + "\" is not a strata token file: magic is 0x" + Hex(p, 8) +
                                ", expected 0x" + Hex(reinterpret_cast<const uint8_t*>(kTokenFileMagic), 8) +
                                " (\"STRTOKN\")");
  out->version = Load<uint32_t>(p + 8);
  if (out->version != kTokenFileVersion)
    return InvalidArgumentError("\"" + path + "\": token file format version " +
                                std::to_string(out->version) + ", this build reads version " +
                                std::to_string(kTokenFileVersion));
  const uint64_t stored = Load<uint64_t>(p + kChecksumOffset), computed = Fnv1a64(p, kChecksumOffset);
  if (stored != computed)
    return CorruptionError("\"" + path + "\": header checksum mismatch (stored " + std::to_string(stored) +
                           ", computed " + std::to_string(computed) + "): the header is damaged");
  out->token_width = Load<uint32_t>(p + 12);
  out->vocab = Load<uint64_t>(p + 16);
  out->count = Load<uint64_t>(p + 24);
  if (out->token_width != 2 && out->token_width != 4)
    return InvalidArgumentError("\"" + path + "\": token width " + std::to_string(out->token_width) +
                                " bytes; only 2 and 4 are defined");
  if (out->vocab < 1 || (out->token_width == 2 && out->vocab > 65536) || out->vocab > (1ULL << 31))
    return InvalidArgumentError("\"" + path + "\": vocab size " + std::to_string(out->vocab) +
                                " does not fit a token width of " + std::to_string(out->token_width) +
                                " bytes");
  const uint64_t payload = file_bytes - kTokenHeaderBytes;
  if (out->count > payload / out->token_width || payload != out->count * out->token_width) {
    const uint64_t expected = kTokenHeaderBytes + out->count * out->token_width;
    const bool short_file = out->count > payload / out->token_width;
    return CorruptionError("\"" + path + "\": " + (short_file ? "truncated" : "trailing bytes") +
                           ": file is " + std::to_string(file_bytes) + " bytes, the header's count of " +
                           std::to_string(out->count) + " tokens needs " +
                           (short_file ? "at least " : "exactly ") + std::to_string(expected));
  }
  return OkStatus();
}

}  // namespace

uint32_t TokenWidthForVocab(uint64_t vocab) { return vocab <= 65536 ? 2 : 4; }

std::string EncodeTokenHeader(const TokenFileHeader& header) {
  uint8_t b[kTokenHeaderBytes] = {};
  std::memcpy(b, kTokenFileMagic, sizeof(kTokenFileMagic));
  std::memcpy(b + 8, &header.version, 4);
  std::memcpy(b + 12, &header.token_width, 4);
  std::memcpy(b + 16, &header.vocab, 8);
  std::memcpy(b + 24, &header.count, 8);
  const uint64_t checksum = Fnv1a64(b, kChecksumOffset);
  std::memcpy(b + kChecksumOffset, &checksum, 8);
  return std::string(reinterpret_cast<const char*>(b), sizeof(b));
}

Result<TokenFile> TokenFile::Open(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0 && errno == ENOENT) return NotFoundError("token file \"" + path + "\" does not exist");
  if (fd < 0) return ErrnoError(errno, "opening token file \"" + path + "\"");
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    const int err = errno;
    ::close(fd);
    return ErrnoError(err, "stat of token file \"" + path + "\"");
  }
  const uint64_t bytes = static_cast<uint64_t>(st.st_size);
  if (bytes < static_cast<uint64_t>(kTokenHeaderBytes)) {
    ::close(fd);
    return CorruptionError("\"" + path + "\": truncated: file is " + std::to_string(bytes) +
                           " bytes, shorter than the " + std::to_string(kTokenHeaderBytes) + "-byte header");
  }
  void* map = ::mmap(nullptr, bytes, PROT_READ, MAP_PRIVATE, fd, 0);
  const int map_err = errno;
  ::close(fd);  // the mapping keeps the file open
  if (map == MAP_FAILED) return ErrnoError(map_err, "mapping token file \"" + path + "\"");
  TokenFile f;
  f.path_ = path;
  f.map_ = static_cast<const uint8_t*>(map);
  f.map_bytes_ = bytes;
  TokenFileHeader h;
  STRATA_RETURN_IF_ERROR(CheckHeader(path, f.map_, bytes, &h));
  f.vocab_ = static_cast<int64_t>(h.vocab);
  f.count_ = static_cast<int64_t>(h.count);
  f.width_ = h.token_width;
  // One pass at open, so that training never meets an id its embedding cannot look up.
  for (int64_t i = 0; i < f.count_; ++i) {
    const int64_t t = f.token(i);
    if (t < 0 || t >= f.vocab_)
      return CorruptionError("\"" + path + "\": token " + std::to_string(i) + " is " +
                             std::to_string(static_cast<uint32_t>(t)) + ", outside the vocabulary of " +
                             std::to_string(f.vocab_));
  }
  return f;
}

TokenFile::TokenFile(TokenFile&& other) noexcept { *this = std::move(other); }

TokenFile& TokenFile::operator=(TokenFile&& other) noexcept {
  if (this == &other) return *this;
  Unmap();
  path_ = std::move(other.path_);
  map_ = std::exchange(other.map_, nullptr);
  map_bytes_ = std::exchange(other.map_bytes_, 0);
  vocab_ = other.vocab_;
  count_ = other.count_;
  width_ = other.width_;
  return *this;
}

TokenFile::~TokenFile() { Unmap(); }

void TokenFile::Unmap() {
  if (map_ != nullptr) ::munmap(const_cast<uint8_t*>(map_), map_bytes_);
  map_ = nullptr;
  map_bytes_ = 0;
}

int32_t TokenFile::token(int64_t i) const {
  STRATA_CHECK(i >= 0 && i < count_);
  const uint8_t* p = map_ + kTokenHeaderBytes + static_cast<size_t>(i) * width_;
  return width_ == 2 ? static_cast<int32_t>(Load<uint16_t>(p)) : static_cast<int32_t>(Load<uint32_t>(p));
}

void TokenFile::Window(int64_t start, int64_t len, int32_t* out) const {
  STRATA_CHECK(start >= 0 && len >= 0 && start + len <= count_);
  const uint8_t* p = map_ + kTokenHeaderBytes + static_cast<size_t>(start) * width_;
  if (width_ == 2) {
    for (int64_t i = 0; i < len; ++i) out[i] = Load<uint16_t>(p + 2 * i);
  } else {
    for (int64_t i = 0; i < len; ++i) out[i] = static_cast<int32_t>(Load<uint32_t>(p + 4 * i));
  }
}

int64_t SampleStart(uint64_t seed, int64_t sample, int64_t file_size, int64_t seq) {
  STRATA_CHECK(seq >= 1 && file_size > seq);
  const uint64_t h = Mix(Mix(Mix(seed + 0x9e3779b97f4a7c15ULL) ^ kSampleStream) +
                         static_cast<uint64_t>(sample) * 0x9e3779b97f4a7c15ULL);
  // The modulo bias is below positions / 2^64: invisible at any corpus size.
  return static_cast<int64_t>(h % static_cast<uint64_t>(file_size - seq));
}

void FillBatch(const TokenFile& file, uint64_t seed, const BatchSlice& slice, int64_t seq, int32_t* tokens,
               int32_t* targets) {
  STRATA_CHECK(slice.rank >= 0 && slice.rank < slice.world_size && slice.micro_batch_size >= 1);
  STRATA_CHECK(slice.micro_batch_index >= 0 && slice.micro_batch_index < slice.accumulation_steps);
  const int64_t first = slice.FirstSampleIndex();
  std::vector<int32_t> window(static_cast<size_t>(seq + 1));
  for (int64_t j = 0; j < slice.micro_batch_size; ++j) {
    const int64_t start = SampleStart(seed, first + j, file.size(), seq);
    file.Window(start, seq + 1, window.data());
    std::copy(window.begin(), window.end() - 1, tokens + j * seq);
    std::copy(window.begin() + 1, window.end(), targets + j * seq);
  }
}

}  // namespace strata::model
