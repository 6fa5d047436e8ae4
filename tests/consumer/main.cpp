// Links against the installed libepx and uses its public API without a GPU.
#include <epx/epx.hpp>

#include <cstdio>
#include <cstring>

int main() {
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
