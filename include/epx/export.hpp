// Symbols of the public API are exported from libepx; everything else is hidden.
#pragma once

#if defined(__GNUC__) || defined(__clang__)
#define EPX_API __attribute__((visibility("default")))
#else
#define EPX_API
#endif
