// Checkpoint file streams (checkpoint_stream.h): two buffers per file, one filling or
// draining while the other is on the disk.
#include "zero/checkpoint_stream.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>

namespace strata::ckpt {

Result<std::unique_ptr<StreamBuffers>> StreamBuffers::Create(HostArena* arena, uint64_t bytes) {
  std::unique_ptr<StreamBuffers> b(new StreamBuffers());
  b->arena_ = arena;
  for (int i = 0; i < 2; ++i) {
    if (arena != nullptr) {
      auto block = arena->Allocate(bytes);
      if (block.ok()) {
        b->block_[i] = *block;
        b->data_[i] = static_cast<uint8_t*>(block->data);
        continue;
      }
    }
    b->data_[i] = static_cast<uint8_t*>(std::aligned_alloc(kIoAlign, AlignUp(bytes)));
    if (b->data_[i] == nullptr) {
      return ResourceExhaustedError("checkpoint: no memory for a " + std::to_string(bytes >> 20) +
                                    " MiB stream buffer");
    }
  }
  return b;
}

StreamBuffers::~StreamBuffers() {
  for (int i = 0; i < 2; ++i) {
    if (block_[i]) {
      arena_->Free(block_[i]);
    } else {
      std::free(data_[i]);
    }
  }
}

OpenFile::~OpenFile() {
  if (id >= 0) io->UnregisterFile(id).IgnoreError();  // the streams wait for their I/O first
  if (fd >= 0) ::close(fd);
}

Result<std::unique_ptr<OpenFile>> OpenForStream(IoEngine& io, const std::string& path, bool write) {
  const int flags = (write ? O_WRONLY | O_CREAT | O_TRUNC : O_RDONLY) | O_CLOEXEC;
  int fd = ::open(path.c_str(), flags | O_DIRECT, 0644);
  // A file system without direct I/O (tmpfs) takes the same aligned requests buffered.
  if (fd < 0 && errno == EINVAL) fd = ::open(path.c_str(), flags, 0644);
  if (fd < 0) return ErrnoError(errno, std::string("checkpoint: open ") + path);
  auto f = std::make_unique<OpenFile>();
  f->io = &io;
  f->path = path;
  f->fd = fd;
  STRATA_ASSIGN_OR_RETURN(f->id, io.RegisterFd(fd, path));
  return f;
}

// --- FileWriter ---

Result<std::unique_ptr<FileWriter>> FileWriter::Create(IoEngine& io, HostArena* arena,
                                                       const std::string& path) {
  std::unique_ptr<FileWriter> w(new FileWriter());
  STRATA_ASSIGN_OR_RETURN(w->bufs_, StreamBuffers::Create(arena));
  STRATA_ASSIGN_OR_RETURN(w->file_, OpenForStream(io, path, /*write=*/true));
  return w;
}

FileWriter::~FileWriter() {
  for (const IoHandle& h : pending_) {
    if (h.valid()) h.Wait().IgnoreError();  // reported by Finish, or the save failed already
  }
}

Status FileWriter::WriteBuffer() {
  auto h = file_->io->Write(file_->id, offset_, fill_, bufs_->at(cur_));
  if (!h.ok()) return h.status();
  pending_[cur_] = *h;
  offset_ += fill_;
  fill_ = 0;
  cur_ ^= 1;
  if (!pending_[cur_].valid()) return OkStatus();
  Status st = pending_[cur_].Wait();
  pending_[cur_] = IoHandle();
  return st.WithContext("checkpoint: writing " + file_->path);
}

Result<std::span<uint8_t>> FileWriter::Space(uint64_t max) {
  if (fill_ == kStreamBufferBytes) STRATA_RETURN_IF_ERROR(WriteBuffer());
  return std::span<uint8_t>(bufs_->at(cur_) + fill_, std::min(max, kStreamBufferBytes - fill_));
}

void FileWriter::Commit(uint64_t n) {
  const uint8_t* p = bufs_->at(cur_) + fill_;
  file_hash_.Update(p, n);
  section_hash_.Update(p, n);
  fill_ += n;
}

Status FileWriter::Append(const void* data, uint64_t n) {
  const uint8_t* src = static_cast<const uint8_t*>(data);
  while (n > 0) {
    STRATA_ASSIGN_OR_RETURN(std::span<uint8_t> room, Space(n));
    std::memcpy(room.data(), src, room.size());
    Commit(room.size());
    src += room.size();
    n -= room.size();
  }
  return OkStatus();
}

Status FileWriter::AppendZeros(uint64_t n) {
  while (n > 0) {
    STRATA_ASSIGN_OR_RETURN(std::span<uint8_t> room, Space(n));
    std::memset(room.data(), 0, room.size());
    Commit(room.size());
    n -= room.size();
  }
  return OkStatus();
}

void FileWriter::BeginSection() { section_hash_.Reset(); }

Result<uint64_t> FileWriter::EndSection() {
  const uint64_t sum = section_hash_.Digest();
  STRATA_RETURN_IF_ERROR(AppendZeros(AlignUp(bytes()) - bytes()));
  return sum;
}

Status FileWriter::Finish() {
  STRATA_RETURN_IF_ERROR(AppendZeros(AlignUp(bytes()) - bytes()));
  if (fill_ > 0) STRATA_RETURN_IF_ERROR(WriteBuffer());
  for (IoHandle& h : pending_) {
    if (!h.valid()) continue;
    Status st = h.Wait();
    h = IoHandle();
    STRATA_RETURN_IF_ERROR(st.WithContext("checkpoint: writing " + file_->path));
  }
  if (::fsync(file_->fd) != 0) return ErrnoError(errno, "checkpoint: fsync " + file_->path);
  return OkStatus();
}

// --- FileReader ---

Result<std::unique_ptr<FileReader>> FileReader::Open(IoEngine& io, HostArena* arena, const std::string& path,
                                                     uint64_t bytes) {
  std::unique_ptr<FileReader> r(new FileReader());
  STRATA_ASSIGN_OR_RETURN(r->file_, OpenForStream(io, path, /*write=*/false));
  struct stat st {};
  if (::fstat(r->file_->fd, &st) != 0) return ErrnoError(errno, "checkpoint: stat " + path);
  if (static_cast<uint64_t>(st.st_size) != bytes) {
    return CorruptionError("checkpoint file " + path + " is " + std::to_string(st.st_size) +
                           " bytes; the manifest says " + std::to_string(bytes) +
                           (static_cast<uint64_t>(st.st_size) < bytes ? " (truncated)" : ""));
  }
  STRATA_ASSIGN_OR_RETURN(r->bufs_, StreamBuffers::Create(arena));
  return r;
}

FileReader::~FileReader() {
  for (const Piece& p : piece_) {
    if (p.handle.valid()) p.handle.Wait().IgnoreError();
  }
}

void FileReader::IssueNext(int slot) {
  Piece& p = piece_[slot];
  p = Piece();
  if (next_issue_ >= sec_aligned_end_) return;
  p.offset = next_issue_;
  p.length = std::min(kStreamBufferBytes, sec_aligned_end_ - next_issue_);
  next_issue_ += p.length;
  auto h = file_->io->Read(file_->id, p.offset, p.length, bufs_->at(slot));
  if (h.ok()) {
    p.handle = *h;
  } else {
    p.issue_error = h.status();
  }
}

Status FileReader::BeginSection(uint64_t offset, uint64_t bytes) {
  if (taken_ != sec_end_ - sec_begin_)
    return InternalError("checkpoint: a section of " + path() + " was left unread");
  if (offset % kIoAlign != 0) return InternalError("checkpoint: unaligned section offset");
  for (const Piece& p : piece_) {
    if (p.handle.valid()) p.handle.Wait().IgnoreError();  // none left in a fully read section
  }
  contiguous_ = contiguous_ && offset == read_end_;
  sec_begin_ = offset;
  sec_end_ = offset + bytes;
  sec_aligned_end_ = offset + AlignUp(bytes);
  next_issue_ = offset;
  taken_ = 0;
  pos_ = 0;
  ready_ = false;
  cur_ = 0;
  section_hash_.Reset();
  IssueNext(0);
  IssueNext(1);
  return OkStatus();
}

Status FileReader::WaitCurrent() {
  Piece& p = piece_[cur_];
  STRATA_RETURN_IF_ERROR(p.issue_error.WithContext("checkpoint: reading " + path()));
  if (p.length == 0) return InternalError("checkpoint: read past the section of " + path());
  Status st = p.handle.Wait();
  p.handle = IoHandle();
  STRATA_RETURN_IF_ERROR(st.WithContext("checkpoint: reading " + path()));
  const uint8_t* data = bufs_->at(cur_);
  if (contiguous_) file_hash_.Update(data, p.length);
  section_hash_.Update(data, std::min(p.length, sec_end_ - p.offset));
  ready_ = true;
  return OkStatus();
}

Result<std::span<const uint8_t>> FileReader::Next(uint64_t max) {
  const uint64_t left = sec_end_ - sec_begin_ - taken_;
  if (left == 0 || max == 0) return std::span<const uint8_t>();
  Piece* p = &piece_[cur_];
  if (ready_ && pos_ == std::min(p->length, sec_end_ - p->offset)) {
    IssueNext(cur_);  // the caller is done with this buffer: refill it
    cur_ ^= 1;
    pos_ = 0;
    ready_ = false;
    p = &piece_[cur_];
  }
  if (!ready_) STRATA_RETURN_IF_ERROR(WaitCurrent());
  const uint64_t data_end = std::min(p->length, sec_end_ - p->offset);
  const uint64_t n = std::min({max, data_end - pos_, left});
  std::span<const uint8_t> view(bufs_->at(cur_) + pos_, n);
  pos_ += n;
  taken_ += n;
  if (taken_ == sec_end_ - sec_begin_) read_end_ = sec_aligned_end_;
  return view;
}

Status FileReader::ReadInto(void* dst, uint64_t n) {
  uint8_t* out = static_cast<uint8_t*>(dst);
  while (n > 0) {
    STRATA_ASSIGN_OR_RETURN(std::span<const uint8_t> v, Next(n));
    if (v.empty()) return InternalError("checkpoint: read past the section of " + path());
    std::memcpy(out, v.data(), v.size());
    out += v.size();
    n -= v.size();
  }
  return OkStatus();
}

Status FileReader::Skip(uint64_t n) {
  while (n > 0) {
    STRATA_ASSIGN_OR_RETURN(std::span<const uint8_t> v, Next(n));
    if (v.empty()) return InternalError("checkpoint: read past the section of " + path());
    n -= v.size();
  }
  return OkStatus();
}

Result<uint64_t> FileReader::EndSection() {
  if (taken_ != sec_end_ - sec_begin_)
    return InternalError("checkpoint: a section of " + path() + " was left unread");
  return section_hash_.Digest();
}

}  // namespace strata::ckpt
