// Whether stamped 16-byte and 128-byte stores (the latter also by bulk copy) arrive whole, over NVLink and
// from a rank to its own memory (see stamp_probe.cu): what the LL protocol's stamped words and lines rest
// on, measured next to the limits.
#pragma once

#include <cstdint>

#include "epx/team.hpp"

namespace epx::bench {

struct StampProbe {
  int64_t lines = 0;        // lines checked per granularity, over every rank and epoch (8 vectors each)
  int64_t torn_16 = 0;      // 16-byte vectors seen with this epoch's stamp and an older payload
  int64_t missing_16 = 0;   // vectors whose stamp never showed within the bound
  int64_t torn_128 = 0;     // 128-byte lines' vectors seen with the line's stamp current and older payload
  int64_t missing_128 = 0;  // lines whose stamp never showed within the bound
  int64_t torn_bulk = 0;    // the same for lines written by bulk copies (1 to 7 lines each)
  int64_t missing_bulk = 0;
};

// Where the stamped stores go and who reads them: to the next rank over NVLink, read there; to this rank's
// own memory, read here; or to this rank's own memory, read by the previous rank over NVLink (a receiver
// that pulls its lines).
enum class StampPath { nvlink, same_gpu, pulled };

// Collective over the team (one process per GPU; the NVLink path needs at least 2).
StampProbe probe_stamped_stores(Team& team, StampPath path);

}  // namespace epx::bench
