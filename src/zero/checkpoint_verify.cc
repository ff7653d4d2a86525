// VerifyCheckpoint (checkpoint.h): every file of a checkpoint read through one stream and
// checked against the manifest, chunk by chunk and whole.
#include <string>

#include "strata/checkpoint.h"
#include "strata/io.h"
#include "zero/checkpoint_manifest.h"
#include "zero/checkpoint_stream.h"

namespace strata {
namespace {

// The file's problems, each a Corruption naming the chunk and its bytes; OK when none.
Status VerifyFile(IoEngine& io, const std::string& dir, const CheckpointInfo& info,
                  const CheckpointFileInfo& f, int* bad_chunks) {
  const std::string path = dir + "/" + f.path;
  auto opened = ckpt::FileReader::Open(io, nullptr, path, f.bytes);
  if (!opened.ok() && opened.status().code() == StatusCode::kNotFound) {
    return NotFoundError("checkpoint " + dir + ": rank " + std::to_string(f.rank) + "'s " + f.kind +
                         " file " + path + " is missing");
  }
  if (!opened.ok()) return opened.status();
  ckpt::FileReader& r = **opened;
  Status first;
  // Chunk checksums cover the shard's bytes; the sections' 4 KiB padding only the file's.
  for (int c = 0; c < info.num_chunks; ++c) {
    STRATA_RETURN_IF_ERROR(r.BeginSection(c * info.chunk_bytes, info.shard_elems * 4));
    STRATA_RETURN_IF_ERROR(r.Skip(info.shard_elems * 4));
    STRATA_ASSIGN_OR_RETURN(uint64_t sum, r.EndSection());
    if (sum != f.chunk_xxh3[c]) {
      ++*bad_chunks;
      if (first.ok()) {
        first = CorruptionError("checkpoint file " + path + ": chunk " + std::to_string(c) + " (bytes " +
                                std::to_string(c * info.chunk_bytes) + " to " +
                                std::to_string((c + 1) * info.chunk_bytes) + ") has checksum " +
                                ChecksumHex(sum) + ", the manifest says " + ChecksumHex(f.chunk_xxh3[c]));
      }
    }
  }
  if (first.ok() && r.file_xxh3() != f.xxh3) {
    first = CorruptionError("checkpoint file " + path + " has checksum " + ChecksumHex(r.file_xxh3()) +
                            ", the manifest says " + ChecksumHex(f.xxh3) +
                            " (its padding between chunks differs)");
  }
  return first;
}

}  // namespace

Status VerifyCheckpoint(const std::string& dir, const std::function<void(const std::string& line)>& report) {
  STRATA_ASSIGN_OR_RETURN(ckpt::Manifest m, ckpt::ReadManifest(dir));
  STRATA_ASSIGN_OR_RETURN(auto io, IoEngine::Create(IoEngineOptions{}));
  Status first;
  for (const CheckpointFileInfo& f : m.info.files) {
    int bad_chunks = 0;
    Status st = VerifyFile(*io, dir, m.info, f, &bad_chunks);
    if (report) {
      report(f.path + ": " +
             (st.ok() ? "ok (" + std::to_string(f.bytes) + " bytes, xxh3 " + ChecksumHex(f.xxh3) + ")"
              : bad_chunks > 0 ? std::to_string(bad_chunks) + " of " + std::to_string(m.info.num_chunks) +
                                     " chunks corrupt: " + st.ToString()
                               : st.ToString()));
    }
    if (first.ok() && !st.ok()) first = st;
  }
  return first;
}

}  // namespace strata
