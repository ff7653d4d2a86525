// The xxHash adapter behind checksum.h.
#include "strata/checksum.h"

#include <xxhash.h>

#include <cstdio>

#include "strata/status.h"

namespace strata {

uint64_t Xxh3(const void* data, size_t bytes) { return XXH3_64bits(data, bytes); }

struct Xxh3Stream::State {
  XXH3_state_t* s = nullptr;
};

Xxh3Stream::Xxh3Stream() : state_(std::make_unique<State>()) {
  state_->s = XXH3_createState();
  STRATA_CHECK_MSG(state_->s != nullptr, "XXH3_createState: out of memory");
  Reset();
}

Xxh3Stream::~Xxh3Stream() { XXH3_freeState(state_->s); }

void Xxh3Stream::Update(const void* data, size_t bytes) {
  if (bytes > 0) XXH3_64bits_update(state_->s, data, bytes);
}

uint64_t Xxh3Stream::Digest() const { return XXH3_64bits_digest(state_->s); }

void Xxh3Stream::Reset() { XXH3_64bits_reset(state_->s); }

std::string ChecksumHex(uint64_t checksum) {
  char text[17];
  std::snprintf(text, sizeof text, "%016llx", static_cast<unsigned long long>(checksum));
  return text;
}

bool ParseChecksumHex(const std::string& hex, uint64_t* checksum) {
  if (hex.size() != 16) return false;
  uint64_t v = 0;
  for (char c : hex) {
    int d;
    if (c >= '0' && c <= '9') {
      d = c - '0';
    } else if (c >= 'a' && c <= 'f') {
      d = c - 'a' + 10;
    } else {
      return false;
    }
    v = v << 4 | static_cast<uint64_t>(d);
  }
  *checksum = v;
  return true;
}

}  // namespace strata
