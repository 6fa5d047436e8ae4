// Links against the installed libepx and uses its public API (C++ and C) without a GPU.
#include <epx/epx.h>
#include <epx/epx.hpp>

#include <cstdio>
#include <cstring>

int main() {
  if (std::strcmp(epx_version(), EPX_VERSION_STRING) != 0) {
    std::printf("the C ABI says version %s, the headers %s\n", epx_version(), EPX_VERSION_STRING);
    return 1;
  }
  if (epx::LlBuffer::required_bytes(epx::LlBufferOptions{}, 2) == 0 || epx::HtBuffer::required_bytes({}, 2) == 0) {
    std::printf("a buffer of the default options needs no memory?\n");
    return 1;
  }
  try {
    epx::Team::create_single_gpu(0);  // invalid on purpose: rejected before touching any GPU
  } catch (const epx::Error& e) {
    if (e.kind() != epx::ErrorKind::invalid_argument || std::strstr(e.what(), "0 ranks") == nullptr) {
      std::printf("unexpected error: %s\n", e.what());
      return 1;
    }
    std::printf("epx %s consumer: ok (%s)\n", EPX_VERSION_STRING, e.what());
    return 0;
  }
  std::printf("an invalid team was accepted\n");
  return 1;
}
