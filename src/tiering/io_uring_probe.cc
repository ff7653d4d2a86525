// ProbeIoUring: what the kernel allows of io_uring here, for `strata info` and the auto
// backend choice. Uses throwaway rings only.
#include <liburing.h>
#include <sys/uio.h>
#include <sys/utsname.h>

#include <cerrno>
#include <string>
#include <utility>

#include "strata/io.h"

namespace strata {

IoUringProbe ProbeIoUring() {
  IoUringProbe probe;
  utsname u{};
  if (uname(&u) == 0) probe.kernel = u.release;
  io_uring ring{};
  io_uring_params p{};
  int ret = io_uring_queue_init_params(4, &ring, &p);
  if (ret < 0) {
    probe.reason = ErrnoError(-ret, "io_uring_setup").message();
    if (ret == -EPERM) probe.reason += " (seccomp, or sysctl kernel.io_uring_disabled)";
    return probe;
  }
  io_uring_sqe* sqe = io_uring_get_sqe(&ring);
  io_uring_prep_nop(sqe);
  io_uring_cqe* cqe = nullptr;
  ret = io_uring_submit_and_wait(&ring, 1);
  if (ret >= 0) ret = io_uring_wait_cqe(&ring, &cqe);
  if (ret < 0 || cqe == nullptr || cqe->res < 0) {
    probe.reason = ErrnoError(ret < 0 ? -ret : (cqe ? -cqe->res : EIO), "io_uring no-op").message();
    io_uring_queue_exit(&ring);
    return probe;
  }
  io_uring_cqe_seen(&ring, cqe);
  probe.usable = true;
  const std::pair<unsigned, const char*> feats[] = {
      {IORING_FEAT_NODROP, "nodrop"},       {IORING_FEAT_SUBMIT_STABLE, "submit-stable"},
      {IORING_FEAT_FAST_POLL, "fast-poll"}, {IORING_FEAT_SQPOLL_NONFIXED, "sqpoll-nonfixed"},
      {IORING_FEAT_EXT_ARG, "ext-arg"},     {IORING_FEAT_NATIVE_WORKERS, "native-workers"},
      {IORING_FEAT_RSRC_TAGS, "rsrc-tags"},
  };
  for (auto& [bit, name] : feats) {
    if (p.features & bit) probe.features.emplace_back(name);
  }
  if (io_uring_register_files_sparse(&ring, 4) == 0) probe.features.emplace_back("registered-files");
  alignas(4096) static thread_local char page[4096];
  iovec iov{page, sizeof(page)};
  if (io_uring_register_buffers(&ring, &iov, 1) == 0) {
    probe.features.emplace_back("fixed-buffers");
    io_uring_unregister_buffers(&ring);
  }
  io_uring_queue_exit(&ring);
  io_uring_params sp{};
  sp.flags = IORING_SETUP_SQPOLL;
  sp.sq_thread_idle = 10;
  if (io_uring_queue_init_params(4, &ring, &sp) == 0) {
    probe.sqpoll = true;
    probe.features.emplace_back("sqpoll");
    io_uring_queue_exit(&ring);
  }
  return probe;
}

}  // namespace strata
