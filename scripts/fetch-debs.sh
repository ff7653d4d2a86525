#!/usr/bin/env bash
# Downloads (does not install) the Debian packages that scripts/device-check.sh needs on
# a GPU machine without a package registry: the libraries strata builds against
# (liburing, hwloc, oneTBB, OpenMPI, GoogleTest, Google Benchmark, nlohmann-json, CLI11,
# xxhash, PCRE2), their library dependencies, and pkg-config. They go into .deb/ (ignored by
# git), which travels with the working tree to the GPU machine; device-check.sh unpacks
# them there into a private prefix with `dpkg -x` (never into /).
#
#   scripts/fetch-debs.sh [dir]        (default dir: .deb)
#
# Run it here, on a machine of the same distribution (Debian 12) with a package
# registry. Packages every Debian system has (priority required/important) and the
# compiler toolchain (gcc, g++, glibc, libstdc++: the CUDA toolkit needs them anyway)
# are left out.
set -euo pipefail
cd "$(dirname "$0")/.."
dir=${1:-.deb}
mkdir -p "$dir"
rm -f "$dir"/*.deb

roots=(
  liburing-dev libhwloc-dev libtbb-dev libopenmpi-dev openmpi-bin
  libgtest-dev libgmock-dev googletest libbenchmark-dev
  nlohmann-json3-dev libcli11-dev libxxhash-dev libpcre2-dev pkgconf pkgconf-bin
)

# Left out: the toolchain and C library (present wherever the CUDA toolkit builds), base
# libraries of every Debian system, and alternatives nothing here needs (flang/LLVM
# for OpenMPI's Fortran, X11/OpenCL hwloc plugins, autotools, ssh).
skip_re='^(gcc|g\+\+|cpp|gfortran|binutils|libc6|libc-dev|libc-bin|libc-dev-bin|linux-libc-dev|libgcc|libstdc\+\+|libgfortran-[0-9]+-dev|libasan|liblsan|libtsan|libubsan|libitm|libatomic|libquadmath|libcc1|libgomp|libhwasan|libisl|libmpc|libmpfr|libgmp|libctf|libbinutils|libgprofng|libjansson|libcrypt|libnsl|libtirpc|perl|libperl|python|libpython|debconf|cdebconf|dpkg|libdpkg|libjs-|tzdata|sensible-utils|ucf|media-types|readline-common|install-info|flang|libflang|libllvm|libclang|libmlir|libz3|libicu|autoconf|automake|autotools-dev|m4$|openssh-client|libdebian-installer|libnewt|libslang|libtextwrap|libx11|libxau|libxcb|libxdmcp|libxext|libxnvctrl|ocl-icd|libhwloc-plugins|libfido2|libcbor|libedit|libkrb5|libgssapi|libk5crypto|libkeyutils|libcom-err|libssl|libsemanage|libsepol|libselinux|libaudit|libpam|libcap-ng|libacl|libdb5|libgdbm|libreadline|libtinfo|libbz2|liblzma|libzstd|libuuid|libmd0|libbsd|libffi|libpcre2-8-0|libxml2|rpcsvc-proto)'

mapfile -t closure < <(apt-cache depends --recurse --no-recommends --no-suggests --no-conflicts \
  --no-breaks --no-replaces --no-enhances "${roots[@]}" 2>/dev/null | grep -E '^[a-z0-9]' | sort -u)

# One query for all: "Package Priority" per concrete package (virtual ones have no record).
mapfile -t wanted < <(printf '%s\n' "${closure[@]}" | grep -Ev "$skip_re" |
  xargs apt-cache show --no-all-versions 2>/dev/null |
  awk '/^Package:/ {p=$2} /^Priority:/ {if ($2 != "required" && $2 != "important") print p}' | sort -u)

echo "fetch-debs: ${#wanted[@]} packages into $dir/"
(cd "$dir" && apt-get download -qq "${wanted[@]}")
printf '%s\n' "${wanted[@]}" > "$dir/PACKAGES"
# The device tool carries at most 64 MiB of ignored paths with the working tree; the
# .debs are all that device-check.sh needs carried (it builds from the sources).
kib=$(du -sk "$dir" | cut -f1)
echo "fetch-debs: $((kib / 1024)) MiB ($kib KiB) in $dir/, carry limit 64 MiB"
if ((kib > 60 * 1024)); then
  echo "fetch-debs: $dir/ is over 60 MiB: too close to the 64 MiB carry limit; trim roots or skip_re" >&2
  exit 1
fi
