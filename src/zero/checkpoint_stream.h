// Sequential streams over one checkpoint file through the I/O engine: a writer that a
// save fills section by section (one section per chunk) and a reader that a load or a
// verify drains the same way. Each holds two fixed buffers, so a stream's host memory is
// 2 x kStreamBufferBytes however large the file: one buffer is filled or drained while
// the other is on its way to or from the disk. XXH3 is taken over every section and over
// the whole file as the bytes pass.
//
// Files are opened with O_DIRECT where the file system allows it and buffered where it
// does not (tmpfs); the writer's Finish() fsyncs either way. Sections start on 4 KiB
// boundaries: the writer pads each with zeros (in the file's checksum, not the
// section's).
//
// Threads: one owner per stream.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>

#include "strata/checksum.h"
#include "strata/host_arena.h"
#include "strata/io.h"
#include "strata/status.h"

namespace strata::ckpt {

inline constexpr uint64_t kIoAlign = 4096;
inline constexpr uint64_t kStreamBufferBytes = 4ull << 20;
inline uint64_t AlignUp(uint64_t n) { return (n + kIoAlign - 1) / kIoAlign * kIoAlign; }

// Two buffers of `bytes` (a multiple of 4 KiB), 4 KiB aligned: pinned from `arena` when
// it has room (the I/O engine then uses them as fixed buffers), else from the heap.
class StreamBuffers {
 public:
  static Result<std::unique_ptr<StreamBuffers>> Create(HostArena* arena, uint64_t bytes = kStreamBufferBytes);
  ~StreamBuffers();
  StreamBuffers(const StreamBuffers&) = delete;
  StreamBuffers& operator=(const StreamBuffers&) = delete;
  uint8_t* at(int i) const { return data_[i]; }

 private:
  StreamBuffers() = default;
  HostArena* arena_ = nullptr;
  HostBlock block_[2];
  uint8_t* data_[2] = {nullptr, nullptr};
};

// A file opened for the stream and registered with the I/O engine; unregistered and
// closed on destruction (after the stream waited for its I/O).
struct OpenFile {
  IoEngine* io = nullptr;
  std::string path;
  int fd = -1;
  int id = -1;
  ~OpenFile();
};
// write: created or truncated; else opened for reading.
Result<std::unique_ptr<OpenFile>> OpenForStream(IoEngine& io, const std::string& path, bool write);

class FileWriter {
 public:
  static Result<std::unique_ptr<FileWriter>> Create(IoEngine& io, HostArena* arena, const std::string& path);
  ~FileWriter();  // waits for writes in flight; a file not Finish()ed is left as it is

  // Room for the next bytes of the file: at least 1 and at most `max` bytes of the
  // buffer being filled (a full buffer goes to the disk first: its error, if the write
  // before it on the other buffer failed). Commit says how many were written there.
  Result<std::span<uint8_t>> Space(uint64_t max);
  void Commit(uint64_t n);
  Status Append(const void* data, uint64_t n);
  Status AppendZeros(uint64_t n);

  void BeginSection();
  // The XXH3 of the bytes since BeginSection; pads the file to 4 KiB with zeros.
  Result<uint64_t> EndSection();
  // Writes what is buffered, waits for every write and fsyncs the file.
  Status Finish();

  uint64_t bytes() const { return offset_ + fill_; }
  uint64_t xxh3() const { return file_hash_.Digest(); }
  const std::string& path() const { return file_->path; }

 private:
  FileWriter() = default;
  Status WriteBuffer();  // issues the current buffer's write and takes the other buffer
  std::unique_ptr<OpenFile> file_;
  std::unique_ptr<StreamBuffers> bufs_;
  int cur_ = 0;
  uint64_t fill_ = 0;    // bytes in the current buffer
  uint64_t offset_ = 0;  // file offset of the current buffer
  IoHandle pending_[2];
  Xxh3Stream file_hash_, section_hash_;
};

class FileReader {
 public:
  // Opens `path` and checks that it holds `bytes` bytes (Corruption naming the file and
  // both sizes otherwise: truncated or grown); NotFound when it is missing.
  static Result<std::unique_ptr<FileReader>> Open(IoEngine& io, HostArena* arena, const std::string& path,
                                                  uint64_t bytes);
  ~FileReader();  // waits for reads in flight

  // Starts reading bytes [offset, offset + bytes): offset 4 KiB aligned, the section's
  // padding to 4 KiB inside the file. Two buffers' worth is read ahead.
  Status BeginSection(uint64_t offset, uint64_t bytes);
  // The next bytes of the section, at least 1 and at most `max` while any are left; the
  // view is valid until the next call on the reader.
  Result<std::span<const uint8_t>> Next(uint64_t max);
  Status ReadInto(void* dst, uint64_t n);
  Status Skip(uint64_t n);
  // The section's XXH3, once all of it was taken (Internal otherwise).
  Result<uint64_t> EndSection();

  // The XXH3 of the file's first read_end() bytes, valid while sections were read one
  // after the other from offset 0 (contiguous()).
  uint64_t file_xxh3() const { return file_hash_.Digest(); }
  bool contiguous() const { return contiguous_; }
  uint64_t read_end() const { return read_end_; }
  const std::string& path() const { return file_->path; }

 private:
  FileReader() = default;
  void IssueNext(int slot);  // the section's next piece into buffer `slot`, if any is left
  Status WaitCurrent();
  std::unique_ptr<OpenFile> file_;
  std::unique_ptr<StreamBuffers> bufs_;
  struct Piece {
    IoHandle handle;
    uint64_t offset = 0, length = 0;  // in the file; length 0: none
    Status issue_error;
  };
  Piece piece_[2];
  int cur_ = 0;
  bool ready_ = false;  // piece_[cur_] was waited for and hashed
  uint64_t pos_ = 0;    // bytes of piece_[cur_] taken
  uint64_t sec_begin_ = 0, sec_end_ = 0, sec_aligned_end_ = 0, next_issue_ = 0, taken_ = 0;
  bool contiguous_ = true;
  uint64_t read_end_ = 0;
  Xxh3Stream file_hash_, section_hash_;
};

}  // namespace strata::ckpt
