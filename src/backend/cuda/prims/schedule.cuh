// SPDX-License-Identifier: Apache-2.0
// Which work a split CTA does: the pieces (sequence, KV head, chunk of its
// query rows, token range) it attends, under one of two schedules.
//
// Fixed (SplitParams::balanced_workers == 0): CTA (x, y) takes split
// x / (head_chunks * kv_heads) of unit x % (head_chunks * kv_heads) for
// sequences of rank y, y + gridDim.y, ... (the index, or longest first:
// SplitParams::sequence_order): every split covers split_tokens of every
// sequence, so with per-sequence lengths most CTAs of short sequences find
// nothing to do while the long ones' splits run late. Paged batches of few
// units fit the split length to the lengths instead (start_fixed_walk) and
// run on a grid of one wave (SplitParams::fitted_ctas, next_fitted_pieces).
//
// Balanced (balanced_workers > 0; policy.cpp, "Balanced schedule"): the
// kernel is launched with one CTA per worker (every resident CTA of the
// device). Each unit (sequence, KV head, chunk) costs its tiles of real keys
// plus a fixed overhead in tile equivalents. The units of a sequence form
// sets of balanced_group neighbours, and so do the workers: the batch's
// sets are laid end to end in (sequence, set) order, every group of workers
// takes an equal run of that line, and member j of a group attends unit j
// of each set in its run. The workers of a group stream the same tokens of
// neighbouring KV heads side by side, so a DRAM row that holds a token's
// heads is read by all of them at once. A unit inside one run is a whole
// piece and writes the output; a unit cut by run boundaries becomes one
// piece per group that touches it, each storing a partial state in its
// worker's slot, and the last of them to finish merges them in run order
// (deterministic: the cut depends only on the lengths). The workers compute
// the cut from the device-resident lengths at the start of the kernel, so a
// captured graph rebalances every replay without the host.
//
// Slots: worker w owns partial-state slots 2w and 2w + 1. A piece of a unit
// that began in an earlier run continues it and takes slot 2w; the one piece
// of w that continues into a later run and did not begin earlier takes
// 2w + 1. A unit's pieces are therefore slot 2 w_first + 1, then 2 w for
// w = w_first + i * balanced_group, 0 < i < pieces (balanced_slot).
#pragma once

#include <cstdint>

#include "backend/cuda/params.h"
#include "backend/cuda/prims/load.cuh"
#include "backend/cuda/prims/query_rows.cuh"

namespace fd {
namespace cuda {

// One piece of a CTA's work.
struct Piece {
  int64_t b = 0;
  int kv_head = 0;
  int chunk = 0;
  TokenRange range = {0, 0, 0};
  int split = 0;         // fixed schedule: the split (the workspace index of its partial)
  int slot = -1;         // balanced: the partial-state slot; -1: the whole unit
  int pieces = 1;        // balanced: the unit's pieces (the merge counter's target); fitted: the splits in use
  int first_worker = 0;  // balanced: the worker of the unit's first piece
};

// Which pieces a split kernel can take: a template parameter, so that each
// kernel carries only the code of its own (the walks and the balanced
// merge slow the host-planned calls of a kernel that also has them:
// instruction fetch; tests/bench/policy.md).
// - walked: any schedule (balanced, fitted, fixed), pieces handed out by
//   warp 0 through shared memory;
// - planned: the fixed schedule with the host's split length, sequences in
//   index order (balanced_workers == 0, fitted_split_floor == 0, no
//   sequence_order): every thread knows its pieces from the grid, CTAs
//   numbered chunk-fastest;
// - cluster: planned, CTAs numbered split-fastest, a unit's splits one
//   cluster (the cluster merge).
enum class SplitSchedule { walked, planned, cluster };

// Whether a launch's pieces are the host's, in index order (a planned
// kernel can run it: a sequence read from sequence_order is one more
// dependent load, and registers the 128-register kernels spill).
__host__ __device__ __forceinline__ bool host_planned(const SplitParams &p) {
  return p.balanced_workers == 0 && p.fitted_split_floor == 0 && p.sequence_order == nullptr;
}

namespace schedule_detail {

__device__ __forceinline__ int64_t warp_sum(int64_t v) {
#pragma unroll
  for (int offset = 16; offset > 0; offset /= 2) v += __shfl_xor_sync(0xffffffffu, v, offset);
  return v;
}

template <class T>
__device__ __forceinline__ T warp_inclusive_scan(T v, int lane) {
#pragma unroll
  for (int offset = 1; offset < 32; offset *= 2) {
    const T other = __shfl_up_sync(0xffffffffu, v, offset);
    if (lane >= offset) v += other;
  }
  return v;
}

// A sequence's tiles of keys its queries see (from first_key: the window).
template <int kTileTokens>
__device__ __forceinline__ int64_t sequence_tiles(const SplitParams &p, int64_t b, int64_t &len, int64_t &first) {
  len = sequence_length(p, b);
  first = first_key(p, len, sequence_q_len(p, b));
  return (len - first + kTileTokens - 1) / kTileTokens;
}

template <int kTileTokens>
__device__ __forceinline__ int64_t unit_cost(const SplitParams &p, int64_t b) {
  int64_t len, first;
  return sequence_tiles<kTileTokens>(p, b, len, first) + p.piece_overhead_tiles;
}

}  // namespace schedule_detail

// The workspace slot of piece i of a cut unit whose first piece ran on
// first_worker (the balanced schedule's slots, above).
__device__ __forceinline__ int balanced_slot(const SplitParams &p, int first_worker, int i) {
  return i == 0 ? 2 * first_worker + 1 : 2 * (first_worker + i * p.balanced_group);
}

// Pieces are handed out in batches through shared memory: warp 0 walks the
// schedule and writes up to kPieceBatch pieces and where it stopped, then
// every warp runs them. Nothing of the walk stays in registers while the
// kernels' main loops run.
constexpr int kPieceBatch = 8;

// 128-byte aligned (and so sized): the kernels' dynamic shared memory,
// which follows it, keeps the alignment of a shared window's start.
struct alignas(128) PieceBatch {
  Piece pieces[kPieceBatch];
  int count;
  int keyed_pieces;  // fitted grid: the batch's pieces with keys
  // Where the walk stands: the next sequence (fixed schedule: the next rank
  // of blockIdx.y, + gridDim.y, ...; fitted grid: the CTA's pieces handed out);
  // balanced: its next set of units (-1: the run's first, still to be
  // found), where its sets start on the line, and this worker's group's run
  // [run_begin, run_end) of a line cut in runs of `run`. Fixed: the split
  // length it cuts every sequence with, and the splits that length leaves
  // in use.
  int64_t b;
  int64_t split_tokens;
  int used_splits;
  int set;
  int64_t sequence_start, run, run_begin, run_end;
};
static_assert(sizeof(PieceBatch) == 4 * 128, "keyed_pieces sits in count's padding: no more shared memory");

namespace schedule_detail {

// The balanced schedule's start (warp 0, all lanes): this worker's group's
// run and the sequence whose sets hold its beginning.
template <int kTileTokens>
__device__ void start_balanced_walk(const SplitParams &p, PieceBatch &batch) {
  const int lane = threadIdx.x % 32;
  const int64_t sets_per_sequence = static_cast<int64_t>(p.head_chunks) * p.kv_heads / p.balanced_group;
  const int64_t groups = p.balanced_workers / p.balanced_group;
  int64_t lane_total = 0;
  for (int64_t b = lane; b < p.batch; b += 32) lane_total += unit_cost<kTileTokens>(p, b);
  const int64_t total = warp_sum(lane_total) * sets_per_sequence;
  const int64_t run = (total + groups - 1) / groups;
  const int64_t run_begin = static_cast<int64_t>(blockIdx.x / p.balanced_group) * run;
  const int64_t run_end = min(total, run_begin + run);
  int64_t b = p.batch;  // none: an empty run
  int64_t sequence_start = 0;
  if (run_begin < run_end) {
    for (int64_t base = 0; base < p.batch; base += 32) {
      const int64_t mine = base + lane < p.batch ? unit_cost<kTileTokens>(p, base + lane) * sets_per_sequence : 0;
      const int64_t inclusive = warp_inclusive_scan(mine, lane);
      const unsigned past = __ballot_sync(0xffffffffu, sequence_start + inclusive > run_begin);
      if (past != 0) {
        const int found = __ffs(past) - 1;
        b = base + found;
        sequence_start += __shfl_sync(0xffffffffu, inclusive - mine, found);
        break;
      }
      sequence_start += __shfl_sync(0xffffffffu, inclusive, 31);
    }
  }
  if (lane == 0) {
    batch.b = b;
    batch.set = -1;
    batch.sequence_start = sequence_start;
    batch.run = run;
    batch.run_begin = run_begin;
    batch.run_end = run_end;
  }
}

// The next pieces of the balanced schedule (warp 0; lane 0 writes). A
// sequence's length is read once for all its sets, and only a unit cut by
// a run boundary pays the divisions that find its workers.
template <int kTileTokens>
__device__ void next_balanced_pieces(const SplitParams &p, PieceBatch &batch) {
  const int sets_per_sequence = p.head_chunks * p.kv_heads / p.balanced_group;
  const int group = static_cast<int>(blockIdx.x) / p.balanced_group;
  const int member = static_cast<int>(blockIdx.x) - group * p.balanced_group;
  int64_t b = batch.b;
  int set = batch.set;
  int64_t sequence_start = batch.sequence_start;
  const int64_t run = batch.run, run_begin = batch.run_begin, run_end = batch.run_end;
  int count = 0;
  while (b < p.batch && count < kPieceBatch) {
    int64_t len, first;
    const int64_t tiles = sequence_tiles<kTileTokens>(p, b, len, first);
    const int64_t cost = tiles + p.piece_overhead_tiles;
    if (set < 0) set = static_cast<int>(max(int64_t{0}, run_begin - sequence_start) / cost);
    for (; set < sets_per_sequence && count < kPieceBatch; ++set) {
      const int64_t set_start = sequence_start + set * cost;  // its overhead; its tiles follow
      if (set_start >= run_end) break;
      const int64_t tiles_start = set_start + p.piece_overhead_tiles;
      const int64_t tiles_end = tiles_start + tiles;
      const int unit = set * p.balanced_group + member;
      Piece piece;
      piece.b = b;
      piece.kv_head = unit / p.head_chunks;
      piece.chunk = unit - piece.kv_head * p.head_chunks;
      bool mine;
      if (tiles == 0) {
        // No keys: the group whose run holds the set's start writes it.
        mine = set_start >= run_begin;
        piece.range = {first, first, len};
      } else {
        const int64_t t0 = max(run_begin, tiles_start) - tiles_start;
        const int64_t t1 = min(run_end, tiles_end) - tiles_start;
        mine = t0 < t1;  // else the run holds only the unit's overhead
        piece.range = {first + t0 * kTileTokens, min(len, first + t1 * kTileTokens), len};
        if (mine && (tiles_start < run_begin || tiles_end > run_end)) {  // cut: which groups share it
          const int64_t first_group = tiles_start / run;
          piece.first_worker = static_cast<int>(first_group) * p.balanced_group + member;
          piece.pieces = static_cast<int>((tiles_end - 1) / run - first_group + 1);
          piece.slot = balanced_slot(p, piece.first_worker, group - static_cast<int>(first_group));
        }
      }
      if (mine && threadIdx.x == 0) batch.pieces[count] = piece;
      count += mine ? 1 : 0;
    }
    if (set < sets_per_sequence) {
      if (count < kPieceBatch) b = p.batch;  // the run is done
      break;
    }
    sequence_start += cost * sets_per_sequence;
    ++b;
    set = 0;
  }
  __syncwarp();  // every lane has read the walk's state before lane 0 moves it on
  if (threadIdx.x == 0) {
    batch.count = count;
    batch.b = b;
    batch.set = set;
    batch.sequence_start = sequence_start;
  }
}

// The span of keys sequence b's queries see (from first_key: the window).
__device__ __forceinline__ unsigned sequence_span(const SplitParams &p, int64_t b) {
  const int64_t len = sequence_length(p, b);
  return static_cast<unsigned>(len - first_key(p, len, sequence_q_len(p, b)));
}

// The fitted grid's piece `index` of one kind (with keys, or empty: a split
// in use past the sequence's keys, which writes an empty state for the merge
// kernel): pieces are numbered sequence by sequence, then split, then KV
// head and chunk, so that neighbouring CTAs read the same tokens of
// neighbouring KV heads. Warp 0, all lanes; lane_span, if not null, holds
// the span of sequence `lane` (the first 32 are not read again). The result
// is uniform.
// 32-bit counts: at most (units) x FD_MAX_SPLITS pieces, with fewer units
// than the device runs CTAs at once. False past the last; *pieces_of_kind
// (if not null) gets the batch's count of that kind.
__device__ inline bool locate_fitted_piece(const SplitParams &p, const PieceBatch &batch, bool empty, unsigned index,
                                           const unsigned *lane_span, Piece &piece,
                                           unsigned *pieces_of_kind = nullptr) {
  const int lane = threadIdx.x % 32;
  const unsigned units = static_cast<unsigned>(p.kv_heads * p.head_chunks);
  const unsigned tile_span = static_cast<unsigned>(batch.split_tokens);
  bool found = false;
  unsigned before = 0;
  for (int64_t first = 0; first < p.batch; first += 32) {
    const int64_t b = first + lane;
    unsigned keyed = 0, count = 0;
    if (b < p.batch) {
      keyed = ((first == 0 && lane_span != nullptr ? *lane_span : sequence_span(p, b)) + tile_span - 1) / tile_span;
      count = units * (empty ? static_cast<unsigned>(batch.used_splits) - keyed : keyed);
    }
    const unsigned end = before + warp_inclusive_scan(count, lane);
    const unsigned holders = __ballot_sync(0xffffffffu, !found && index < end && index >= end - count);
    if (holders != 0) {
      const int holder = __ffs(holders) - 1;
      const unsigned local = index - __shfl_sync(0xffffffffu, end - count, holder);
      const unsigned unit = local % units;
      piece.b = first + holder;
      piece.kv_head = static_cast<int>(unit) / p.head_chunks;
      piece.chunk = static_cast<int>(unit) % p.head_chunks;
      piece.split = static_cast<int>(local / units + (empty ? __shfl_sync(0xffffffffu, keyed, holder) : 0u));
      piece.range = split_range(p, piece.b, piece.split, batch.split_tokens);
      piece.pieces = batch.used_splits;
      found = true;
      if (pieces_of_kind == nullptr) return true;
    }
    before = __shfl_sync(0xffffffffu, end, 31);
  }
  if (pieces_of_kind != nullptr) *pieces_of_kind = before;
  return found;
}

// The fixed schedule's start (warp 0, all lanes): the split length, as
// planned over the capacity or, with fitted_split_floor, fitted to the spans
// of keys the sequences' queries see: whole tiles, long enough that
// num_splits cover the longest span and that the batch's keys make no more
// pieces than the policy's target, at least the floor. So a block table far
// wider than the lengths still spreads each sequence over its splits, and a
// table as wide as them is cut for one wave, not for the planned waves. The
// splits past the longest span's last are not run; CTA 0 publishes how many
// are in use for the merge kernel (used_splits). On the fitted grid, this
// CTA's piece with keys goes to pieces[0] (next_fitted_pieces).
template <int kTileTokens>
__device__ void start_fixed_walk(const SplitParams &p, PieceBatch &batch) {
  const int lane = threadIdx.x % 32;
  int64_t split_tokens = p.split_tokens;
  int used_splits = p.num_splits;
  if (p.fitted_split_floor > 0) {
    // 32-bit and float arithmetic: every CTA pays this before its first
    // load. Lengths are clamped to kv_capacity (an int32); the total only
    // steers the length, so its float rounding costs nothing but that.
    unsigned longest = 0, lane_span = 0;
    float total = 0.0f;
    for (int64_t b = lane; b < p.batch; b += 32) {
      const unsigned span = sequence_span(p, b);
      if (b == lane) lane_span = span;
      longest = max(longest, span);
      total += static_cast<float>(span);
    }
    longest = __reduce_max_sync(0xffffffffu, longest);
#pragma unroll
    for (int offset = 16; offset > 0; offset /= 2) total += __shfl_xor_sync(0xffffffffu, total, offset);
    const unsigned splits = static_cast<unsigned>(p.num_splits);
    const int64_t shortest = p.fitted_split_floor;
    const int64_t tokens = max(max(static_cast<int64_t>((longest + splits - 1) / splits),
                                   static_cast<int64_t>(ceilf(total * p.fitted_tokens_per_total))),
                               shortest);
    // Never past one split a sequence: the same pieces, and a length that
    // fits the 32-bit counts below however long the sequences.
    const int64_t whole = max(static_cast<int64_t>(longest), shortest);
    split_tokens = (min(tokens, whole) + kTileTokens - 1) / kTileTokens * kTileTokens;
    const unsigned tile_span = static_cast<unsigned>(split_tokens);
    // At least one split: a batch without keys still writes its rows (zeros, LSE -inf).
    used_splits = static_cast<int>(min(splits, max(1u, (longest + tile_span - 1) / tile_span)));
    if (lane == 0 && blockIdx.x == 0 && blockIdx.y == 0) *p.used_splits = used_splits;
    if (p.fitted_ctas > 0) {
      if (lane == 0) {
        batch.split_tokens = split_tokens;
        batch.used_splits = used_splits;
      }
      __syncwarp();
      Piece piece;
      unsigned keyed_pieces = 0;
      const bool keyed = locate_fitted_piece(p, batch, false, blockIdx.x, &lane_span, piece, &keyed_pieces);
      if (lane == 0) {
        if (keyed) batch.pieces[0] = piece;
        batch.b = keyed ? -1 : 0;
        batch.keyed_pieces = static_cast<int>(keyed_pieces);
      }
      return;
    }
  }
  if (lane == 0) {
    batch.b = blockIdx.y;
    batch.split_tokens = split_tokens;
    batch.used_splits = used_splits;
  }
}

// The fitted grid's next pieces (warp 0, all lanes; lane 0 writes): the
// policy sized the cut so that the pieces with keys are at most the CTAs,
// one wave. CTA g attends piece g of them (start_fixed_walk put it in
// pieces[0]; should the float arithmetic of the cut ever leave more, also
// g + CTAs, ...), then writes the empty states e = g - keyed_pieces (mod
// CTAs), e + CTAs, ...: the CTAs without keys take them first. batch.b
// counts this CTA's pieces handed out so far (-1: the first is in pieces[0]).
__device__ inline void next_fitted_pieces(const SplitParams &p, PieceBatch &batch) {
  const unsigned ctas = gridDim.x;
  const unsigned g = blockIdx.x;
  const unsigned keyed_pieces = static_cast<unsigned>(batch.keyed_pieces);
  const unsigned empty_pieces = static_cast<unsigned>(p.kv_heads * p.head_chunks) * static_cast<unsigned>(p.batch) *
                                    static_cast<unsigned>(batch.used_splits) -
                                keyed_pieces;
  const unsigned my_keyed = g < keyed_pieces ? (keyed_pieces - 1 - g) / ctas + 1 : 0;
  const unsigned first_empty = (g + ctas - keyed_pieces % ctas) % ctas;
  int count = 0;
  int64_t k = batch.b;
  if (k < 0) {  // the first piece with keys, in pieces[0] already
    count = 1;
    k = 1;
  }
  Piece piece;
  for (; count < kPieceBatch; ++k) {
    const bool keyed = k < my_keyed;
    const int64_t index =
        keyed ? g + k * static_cast<int64_t>(ctas) : first_empty + (k - my_keyed) * static_cast<int64_t>(ctas);
    if (index >= (keyed ? keyed_pieces : empty_pieces) ||
        !locate_fitted_piece(p, batch, !keyed, static_cast<unsigned>(index), nullptr, piece))
      break;
    if (threadIdx.x == 0) batch.pieces[count] = piece;
    ++count;
  }
  __syncwarp();
  if (threadIdx.x == 0) {
    batch.b = k;
    batch.count = count;
  }
}

// The fixed schedule's unit and split of this CTA: CTAs numbered
// split-fastest (the cluster kernels), else chunk-fastest, then KV head,
// then split; `pieces` the splits in use.
template <bool kSplitFastest>
__device__ __forceinline__ Piece fixed_unit_piece(const SplitParams &p, int used_splits) {
  const unsigned unit_cta = kSplitFastest ? blockIdx.x / p.num_splits : blockIdx.x;
  Piece piece;
  piece.chunk = unit_cta % p.head_chunks;
  piece.kv_head = (unit_cta / p.head_chunks) % p.kv_heads;
  piece.split = kSplitFastest ? blockIdx.x % p.num_splits : blockIdx.x / (p.head_chunks * p.kv_heads);
  piece.pieces = used_splits;
  return piece;
}

// The piece's sequence of rank `rank` (the rank itself, or with kOrdered
// and a sequence_order the sequence it names) and its split's tokens
// (kQueryLens: split_range's).
template <bool kOrdered, bool kQueryLens = true>
__device__ __forceinline__ void place_fixed_piece(const SplitParams &p, int64_t rank, int64_t split_tokens,
                                                  Piece &piece) {
  piece.b = kOrdered && p.sequence_order != nullptr ? int64_t{p.sequence_order[rank]} : rank;
  piece.range = split_range<kQueryLens>(p, piece.b, piece.split, split_tokens);
}

// The next pieces of the fixed schedule (warp 0, all lanes; lane 0 writes).
// Row y of the grid takes the sequences of rank y, y + gridDim.y, ...: the
// rank is the sequence, or with sequence_order the sequence it names.
__device__ inline void next_fixed_pieces(const SplitParams &p, PieceBatch &batch) {
  if (p.fitted_ctas > 0) {
    next_fitted_pieces(p, batch);
    return;
  }
  if (threadIdx.x != 0) return;
  Piece piece = fixed_unit_piece<false>(p, batch.used_splits);
  int count = 0;
  int64_t rank = piece.split < batch.used_splits ? batch.b : p.batch;  // a split past those in use: nothing
  for (; rank < p.batch && count < kPieceBatch; rank += gridDim.y) {
    place_fixed_piece<true>(p, rank, batch.split_tokens, piece);
    batch.pieces[count++] = piece;
  }
  batch.b = rank;
  batch.count = count;
}

}  // namespace schedule_detail

// Calls piece_body(const Piece &) for every piece of this CTA's work, in
// order, with every thread of the CTA (the body may use __syncthreads).
// The fixed schedule numbers CTAs split-fastest in the cluster kernels (a
// unit's splits form one cluster), else chunk-fastest, then KV head, then
// split (the chunks of one KV head are neighbours, so their reads of the
// same K/V meet in L2).
template <int kTileTokens, SplitSchedule kSchedule = SplitSchedule::walked, class Body>
__device__ __forceinline__ void for_each_piece(const SplitParams &p, Body &&piece_body) {
  using namespace schedule_detail;
  if constexpr (kSchedule != SplitSchedule::walked) {
    // No walk, no hand-off, no barrier before the first copy; sequences in
    // index order (host_planned); no variants' scoring (with_schedule), so
    // no q_lens.
    constexpr bool kSplitFastest = kSchedule == SplitSchedule::cluster;
    Piece piece = fixed_unit_piece<kSplitFastest>(p, p.num_splits);
    for (int64_t rank = blockIdx.y; rank < p.batch; rank += gridDim.y) {
      place_fixed_piece<false, false>(p, rank, p.split_tokens, piece);
      piece_body(piece);
    }
  } else {
    __shared__ PieceBatch batch;
    const bool balanced = p.balanced_workers > 0;
    if (threadIdx.x < 32) {
      if (balanced) {
        start_balanced_walk<kTileTokens>(p, batch);
      } else {
        start_fixed_walk<kTileTokens>(p, batch);
      }
    }
    for (;;) {
      if (threadIdx.x < 32) {
        __syncwarp();
        if (balanced) {
          next_balanced_pieces<kTileTokens>(p, batch);
        } else {
          next_fixed_pieces(p, batch);
        }
      }
      __syncthreads();  // the batch is written
      const int count = batch.count;
      for (int i = 0; i < count; ++i) piece_body(batch.pieces[i]);
      if (count < kPieceBatch) return;
      __syncthreads();  // everyone has read the batch: warp 0 refills it
    }
  }
}

// Where a piece's partial state of its chunk's row `row` (0 .. rows of the
// chunk) goes: the fixed schedule's workspace layout (core/plan.h: rows in
// workspace_row order, splits inside), or the balanced schedule's slots of
// heads_per_chunk rows each.
template <SplitSchedule kSchedule = SplitSchedule::walked>
__device__ __forceinline__ int64_t partial_state_index(const SplitParams &p, const Piece &piece, int row) {
  if (kSchedule == SplitSchedule::walked && p.balanced_workers > 0)
    return static_cast<int64_t>(piece.slot) * p.heads_per_chunk + row;
  return workspace_row(p, piece.b, piece.kv_head, piece.chunk * p.heads_per_chunk + row) * p.num_splits + piece.split;
}

// Whether the piece writes out and lse itself (else a partial state): the
// balanced schedule's whole units, a plan of one split, and fitted splits
// of which one is in use (every sequence within the first; the merge kernel
// then returns at once). The planned and cluster kernels run neither.
template <SplitSchedule kSchedule = SplitSchedule::walked>
__device__ __forceinline__ bool piece_writes_output(const SplitParams &p, const Piece &piece) {
  if (kSchedule != SplitSchedule::walked) return p.write_output;
  if (p.balanced_workers > 0) return piece.slot < 0;
  return p.write_output || (p.used_splits != nullptr && piece.pieces == 1);
}

}  // namespace cuda
}  // namespace fd
