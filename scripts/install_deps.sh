#!/usr/bin/env bash
# Installs what the build needs beyond the CUDA toolkit (13.x, with NCCL 2.28): CMake >= 3.25, a
# C++20 compiler and GoogleTest. Does nothing when they are already there.
set -euo pipefail
missing=()
command -v cmake >/dev/null || missing+=(cmake)
command -v g++ >/dev/null || missing+=(g++)
[ -f /usr/include/gtest/gtest.h ] || [ -f /usr/local/include/gtest/gtest.h ] || missing+=(libgtest-dev)
[ ${#missing[@]} -eq 0 ] && exit 0
if [ "$(id -u)" -ne 0 ] || ! command -v apt-get >/dev/null; then
  echo "epx: please install ${missing[*]} (needs root and apt-get to do it here)" >&2
  exit 1
fi
echo "epx: installing ${missing[*]}"
apt-get update -qq
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
