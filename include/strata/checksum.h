// XXH3-64 checksums (xxHash), for data that leaves strata's memory: the NVMe store's
// segments and the checkpoint files. xxhash itself stays inside the tiering layer's
// adapter (src/tiering/checksum.cc); other layers hash through this header.
//
// Threads: Xxh3 may be called from any thread. An Xxh3Stream has one owner.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

namespace strata {

// The XXH3-64 of `bytes` bytes at `data` (seed 0).
uint64_t Xxh3(const void* data, size_t bytes);

// XXH3-64 over data handed in piece by piece: Digest() equals Xxh3 of the pieces
// concatenated, whatever the cut.
class Xxh3Stream {
 public:
  Xxh3Stream();
  ~Xxh3Stream();
  Xxh3Stream(const Xxh3Stream&) = delete;
  Xxh3Stream& operator=(const Xxh3Stream&) = delete;

  void Update(const void* data, size_t bytes);
  uint64_t Digest() const;  // of everything since construction or the last Reset
  void Reset();

 private:
  struct State;
  std::unique_ptr<State> state_;
};

// "0123456789abcdef": 16 lower-case hex digits, as checksums are written in manifests.
std::string ChecksumHex(uint64_t checksum);
// The inverse of ChecksumHex; false when `hex` is not 16 hex digits.
bool ParseChecksumHex(const std::string& hex, uint64_t* checksum);

}  // namespace strata
