// Inputs every rank can regenerate, shared by the HT and LL benches. Every value is a pure function of
// (seed, rank, what, index): each rank builds every other rank's inputs for the global CPU reference
// without any exchange, and runs repeat. The functions are constexpr so that kernels can use them too
// (the bench compiles with --expt-relaxed-constexpr).
#pragma once

#include <algorithm>
#include <cstdint>

#include "epx/reference/numeric.hpp"
#include "epx/reference/routing.hpp"
#include "epx/reference/tensor.hpp"

namespace epx::bench {

// What a draw is for; each gives an independent stream of values. New kinds go at the end, so that
// the existing streams (and the inputs of earlier runs) stay the same.
enum class What : uint64_t { routing = 1, weights, x_bf16, x_fp8, scales, expert_output };

constexpr uint64_t mix(uint64_t z) {  // splitmix64's output function: a bijection that scrambles every bit
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

class Draw {
 public:
  constexpr Draw(uint64_t seed, int rank, What what) : key_(mix(mix(seed + uint64_t(rank)) ^ mix(uint64_t(what)))) {}
  constexpr uint64_t operator()(uint64_t index) const { return mix(key_ ^ mix(index)); }

 private:
  uint64_t key_;
};

struct Routing {
  ref::TopkIdx topk_idx;       // [T][K], K distinct experts per token
  ref::Matrix<float> weights;  // [T][K], in (0, 1]
};

// Uniform routing of one rank's tokens: each token draws its K experts uniformly from E, redrawing
// repeats (so no -1 and no expert twice).
inline Routing make_routing(uint64_t seed, int rank, int tokens, int topk, int experts) {
  const Draw pick(seed, rank, What::routing), weight(seed, rank, What::weights);
  Routing r{ref::TopkIdx(tokens, topk, -1), ref::Matrix<float>(tokens, topk, 0.0f)};
  uint64_t draws = 0;
  for (int64_t t = 0; t < tokens; ++t) {
    int64_t* row = r.topk_idx.data.data() + t * topk;
    for (int k = 0; k < topk; ++k) {
      do {
        row[k] = int64_t(pick(draws++) % uint64_t(experts));
      } while (std::find(row, row + k, row[k]) != row + k);
      r.weights.data[t * topk + k] = float((weight(t * topk + k) >> 40) + 1) * 0x1p-24f;
    }
  }
  return r;
}

// One rank's BF16 tokens [T][H] (ref::random_bf16 values).
inline ref::Matrix<uint16_t> make_bf16_tokens(uint64_t seed, int rank, int tokens, int hidden) {
  const Draw draw(seed, rank, What::x_bf16);
  ref::Matrix<uint16_t> x(tokens, hidden);
  for (std::size_t i = 0; i < x.data.size(); ++i) x.data[i] = ref::random_bf16(draw(i));
  return x;
}

}  // namespace epx::bench
