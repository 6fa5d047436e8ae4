// A stamped word: a 32-bit stamp of a call in the high half, a 32-bit value in the low half, written and
// read as one 8-byte access (single-copy atomic), so a reader that sees its call's stamp has the value
// written with it: waiting for it needs no flag and no fence. Each protocol says how its stamps are
// chosen (HT: the low 32 bits of the call number, ht_areas.hpp; LL: ll_stamp, ll_areas.hpp).
#pragma once

#include <cstdint>

namespace epx::core {

inline constexpr uint64_t stamped(uint64_t call, uint32_t value) { return (uint64_t(uint32_t(call)) << 32) | value; }
inline constexpr bool stamped_in(uint64_t word, uint64_t call) { return uint32_t(word >> 32) == uint32_t(call); }
inline constexpr uint32_t stamped_value(uint64_t word) { return uint32_t(word); }

}  // namespace epx::core
