// SPDX-License-Identifier: Apache-2.0
#include "backend/cuda/policy.h"

#include <algorithm>

namespace fd {
namespace cuda {
namespace {

// Splits shorter than this cost more in partial-state traffic and pipeline
// start-up than they win in parallelism ("Minimum split length").
constexpr int64_t kMinSplitTokens = 128;
// The planner's wave model (core/plan.cpp): a CTA's fixed cost (pipeline
// fill, epilogue) and the merge launch, in tokens a CTA streams meanwhile
// ("The wave model").
constexpr int64_t kSplitOverheadTokens = 64;
constexpr int64_t kMergeOverheadTokens = 128;

// The merge is fused into the split kernel (the last CTA of a unit merges
// it) when a unit's partials fit in the split kernel's shared memory and are
// at most this many bytes; larger units go to the merge kernel, which
// spreads each row over its own CTA ("Fused merge size"). Overridable at
// build time for A/B measurements (0: never fused).
#ifndef FD_FUSED_MERGE_MAX_BYTES
#define FD_FUSED_MERGE_MAX_BYTES (64 * 1024)
#endif
constexpr int64_t kFusedMergeMaxBytes = FD_FUSED_MERGE_MAX_BYTES;

// The cluster merge (cluster_merge_fits); 0 at build time turns it off for
// A/B measurements ("Cluster merge").
#ifndef FD_CLUSTER_MERGE
#define FD_CLUSTER_MERGE 1
#endif

// Batch-invariant plans take wide tiles (dense caches, head_dim above 64)
// for splits of at least this many tokens: shorter ones, and head_dim 64,
// stream faster on standard tiles ("Batch-invariant mode"). Overridable at
// build time for A/B measurements.
#ifndef FD_INVARIANT_WIDE_MIN_SPLIT_TOKENS
#define FD_INVARIANT_WIDE_MIN_SPLIT_TOKENS 2048
#endif
constexpr int64_t kInvariantWideMinSplitTokens = FD_INVARIANT_WIDE_MIN_SPLIT_TOKENS;

// MHA (one query head per KV head) with head_dim 65-128 and at least this
// many waves of tensor-core CTAs runs the CUDA-core kernel: the tensor-core
// CTA fills 1 of its 16 head slots and has the larger fixed cost, which many
// short CTAs pay over and over ("MHA on CUDA cores").
constexpr int64_t kMhaCudaCoreMinWaves = 16;

// The balanced schedule (prims/schedule.cuh) for per-sequence lengths with
// automatic splits; 0 at build time turns it off for A/B measurements
// ("Balanced schedule").
#ifndef FD_BALANCED_SCHEDULE
#define FD_BALANCED_SCHEDULE 1
#endif

// Its workers: this many waves of every resident CTA. Overridable at build
// time for A/B measurements (2 and 4 measured slower: every worker pays the
// walk over the lengths, and more runs cut more sequences).
#ifndef FD_BALANCED_WAVES
#define FD_BALANCED_WAVES 1
#endif

// Its groups: at most this many workers take one run, each attending its own
// of as many neighbouring units (KV heads) of a sequence, so that a token's
// heads are read side by side; 1 at build time gives every worker its own
// run, for A/B measurements ("Balanced schedule").
#ifndef FD_BALANCED_MAX_GROUP
#define FD_BALANCED_MAX_GROUP 64
#endif

// Batches of at least this many waves of units keep the fixed schedule: one
// CTA a unit, which the hardware already balances, measured faster there
// than workers walking a dozen pieces each ("Balanced schedule"). Compact
// tiles have twice the workers: half the waves, the same units a
// multiprocessor (serving batch 3's 3072 units ran faster fixed).
constexpr int64_t kBalancedMaxUnitWaves = 8;
constexpr int64_t kCompactBalancedMaxUnitWaves = 4;

// Batches of so few units that the balanced schedule would cut each into
// more than this many pieces on average keep the fixed schedule too: the
// last piece of a unit merges all of them alone, where the fixed splits'
// merge kernel spreads the merge over many CTAs. Since the fixed splits fit
// the lengths, 32 units (8.25 pieces) ran 0.95-0.97x the time fixed on an
// H100 and 40-64 units 1.06x, batches sorted by length ("Balanced schedule").
constexpr int64_t kBalancedMaxPiecesPerUnit = 8;

// Fixed-schedule grids of more than one wave with lengths on the device run
// their sequences longest first (SplitParams::sequence_order, written by a
// one-CTA kernel ahead of the split kernel): a long unit started late
// leaves the device idle at the end of the call while it streams alone.
// Serving batch 3 sorted longest first on the host ran 2.8-4.0% faster than
// in the drawn order (history run 96); each CTA finding its own rank from
// the lengths cost more than that (run 97). The order kernel reads every
// length twice, in one CTA, so only batches up to this many sequences.
constexpr int64_t kLongestFirstMaxBatch = kMaxOrderedSequences;
// Only grids of at most this many splits a unit: a sequence's length sets
// the size of its pieces, which the order then sorts. Cut into more, most
// pieces are a whole split long whatever the order, and the split kernel
// only waits for the order kernel: 16x32/8x1..16384 dense (5 splits) ran
// 1.019x main's time ordered (run 98; 1.014x ordered per CTA, run 97),
// where batches of one and two splits gained 2-3.4%.
constexpr int32_t kLongestFirstMaxSplits = 2;
// Only grids whose split is at least this many tokens for every wave of
// CTAs: what the order saves is about one long unit's time, a share that
// shrinks with the waves, where what it costs grows with them as the units
// shorten (likely the shortest, run last together, no longer hide their
// fill and epilogue behind longer units' streams). Ordered against the
// drawn order (run 99): 106-264 tokens a wave 0.96-0.99x the time on an
// H100, 264 0.96x on an H200; 66 0.99x on an H100 but 1.008x on an H200;
// 33 and fewer 1.01-1.07x on both.
constexpr int64_t kLongestFirstMinSplitTokensPerWave = 96;

// Whether a batch's fixed grid of num_splits splits a unit may be ordered:
// the plan reserves the order only then.
bool may_order_sequences(const Problem &p, int32_t num_splits) {
  return p.has_seq_lens && p.batch > 1 && p.batch <= kLongestFirstMaxBatch && num_splits <= kLongestFirstMaxSplits;
}

// Compact tiles for paged serving batches ("Compact tensor-core tiles"):
// four CTAs a multiprocessor hide one unit's pipeline fill and epilogue
// behind the others', where many units each pay them, but stream a long
// run of keys slower than the standard tiles. They take batches of at
// least two units a multiprocessor (with fewer, the balanced schedule cuts
// each unit into long runs, which ran 1-6% faster on the standard tiles)
// in pages of at least kCompactMinPageSize tokens
// (pages of 1 ran slower on them: the block-table ring of small pages looks
// kStages tiles ahead, and their tiles are half as long).
constexpr int64_t kCompactMinUnitsPerSm = 2;
constexpr int64_t kCompactMinPageSize = 16;

// Query rows a KV head above which the rows kernels run (rows_kernel_takes):
// one m-tile's.
#ifndef FD_ROWS_KERNEL_MIN_ROWS
#define FD_ROWS_KERNEL_MIN_ROWS 16
#endif
constexpr int64_t kRowsKernelMinRows = FD_ROWS_KERNEL_MIN_ROWS;

// Up to 32 rows, the wide 64-row kernel runs splits of at least this many
// of its tiles (wide_rows_take_long_splits); 0 at build time keeps them on
// the 32-row kernel, for A/B measurements.
#ifndef FD_ROWS_WIDE_MIN_SPLIT_TILES
#define FD_ROWS_WIDE_MIN_SPLIT_TILES 32
#endif
constexpr int64_t kRowsWideMinSplitTiles = FD_ROWS_WIDE_MIN_SPLIT_TILES;

// 8-bit caches with up to this many query rows a KV head run the keys on
// the MMA's M (tensor_core_8bit_keys), whose N of 8 row slots they fill.
// 0 at build time keeps them on tensor_core_8bit, for A/B measurements
// ("Keys on M for 8-bit caches").
#ifndef FD_Q8_KEYS_MAX_ROWS
#define FD_Q8_KEYS_MAX_ROWS 8
#endif
constexpr int64_t kQ8KeysMaxRows = FD_Q8_KEYS_MAX_ROWS;

// What a piece of the balanced schedule costs beyond its keys (pipeline
// fill, query load, epilogue), in tokens: rounded up to whole tiles.
constexpr int64_t kPieceOverheadTokens = 64;

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

int next_power_of_two(int64_t n) {
  int p = 1;
  while (p < n) p *= 2;
  return p;
}

// A KV head's query rows (q_len x group) in chunks of at most `rows`, as even as possible.
HeadTiling tile_heads(int64_t kv_rows, int rows) {
  HeadTiling t;
  t.chunks = static_cast<int>(ceil_div(kv_rows, rows));
  t.heads_per_chunk = static_cast<int>(ceil_div(kv_rows, t.chunks));
  t.heads_per_cta = next_power_of_two(t.heads_per_chunk);
  return t;
}

// Whether the tensor cores can run a problem: 16-bit K/V with q and out of
// the same type. P is rounded to 16 bits before P V, which a float output's
// 1e-5 bound would not absorb, so float outputs stay on the CUDA cores.
// 8-bit caches are dequantized into 16-bit tiles of q's type: the same
// rule with q's dtype in place of K/V's.
bool tensor_cores_take(const Problem &p) {
  // Their rows are read in whole 16-byte chunks: head_dim a multiple of 16.
  if (p.kv_quantized) {
    return p.out_dtype == p.q_dtype && (p.q_dtype == FD_DTYPE_F16 || p.q_dtype == FD_DTYPE_BF16) &&
           p.head_dim % 16 == 0 && split_variant_takes(SplitVariant::tensor_core_8bit, p.kv_dtype);
  }
  return p.q_dtype == p.kv_dtype && p.out_dtype == p.kv_dtype &&
         split_variant_takes(SplitVariant::tensor_core, p.kv_dtype);
}

// The variant that runs whatever the others cannot, for the cache's dtype.
SplitVariant fallback_variant(const Problem &p) {
  return p.kv_quantized ? SplitVariant::cuda_core_8bit : SplitVariant::cuda_core;
}

bool mha_bucket_128(const Problem &p) { return p.rows_per_kv_head() == 1 && p.head_dim > 64 && p.head_dim <= 128; }

SplitKernelShape shape_of(const Problem &p, SplitVariant variant) {
  return split_kernel_shape(variant, p.kv_dtype, p.head_dim);
}

int resident_ctas(const Problem &p, SplitVariant variant, const DeviceProfile &device) {
  return std::max(1, device.occupancy.ctas(variant, p.kv_dtype, head_dim_bucket(p.head_dim)));
}

// CTAs of `variant` the whole device runs at once: one wave.
int64_t resident_slots(const Problem &p, SplitVariant variant, const DeviceProfile &device) {
  return static_cast<int64_t>(device.sm_count) * resident_ctas(p, variant, device);
}

// What the wave model needs to know about running p on `variant`.
SplitCostModel cost_model(const Problem &p, SplitVariant variant, const DeviceProfile &device) {
  const SplitKernelShape shape = shape_of(p, variant);
  const HeadTiling heads = tile_heads(p.rows_per_kv_head(), shape.rows);
  SplitCostModel model;
  // A unit of the planner is one (sequence, KV head); each takes
  // heads.chunks CTAs per split.
  model.workers = std::max<int64_t>(1, resident_slots(p, variant, device) / heads.chunks);
  model.min_split_tokens = kMinSplitTokens;
  model.split_granularity = shape.tile_tokens;
  model.split_overhead_tokens = kSplitOverheadTokens;
  model.merge_overhead_tokens = kMergeOverheadTokens;
  // A wide CTA holds twice the loads in flight of a standard one (128 KiB
  // of stages against 64) and streams a split about twice as fast.
  model.time_per_token = variant == SplitVariant::tensor_core_wide ? 0.5 : 1.0;
  return model;
}

// Whether splits of a problem cut `splits` ways are longer than the
// pipeline of a kernel of this shape (stages x tile tokens), so that its
// CTAs refill stages while computing; the wave model's per-token costs do
// not see this ("Wide tensor-core tiles").
bool refills_pipeline(const Problem &p, const SplitKernelShape &shape, int splits) {
  const int64_t tile = std::max(1, shape.tile_tokens);
  const int64_t split_tokens =
      ceil_div(ceil_div(std::max<int64_t>(1, planned_kv_span(p)), std::max(1, splits)), tile) * tile;
  return split_tokens > static_cast<int64_t>(shape.stages) * shape.tile_tokens;
}

// A variant and, when choosing it took one, its automatic split estimate.
struct VariantChoice {
  SplitVariant variant = SplitVariant::cuda_core;
  bool estimated = false;
  SplitEstimate estimate;
};

// Batch-invariant plans (flashdecode.h, "Batch invariance"): the kernel may
// depend on nothing that changes with the batch (size, capacity, whether
// lengths are given), since another kernel rounds differently; the caller's
// split length is fixed, so it may decide. The tensor cores where they take
// the problem (no MHA wave rule: it counts the batch; MHA measured as fast
// on them with fixed splits), wide tiles for long splits of dense caches
// where the device has them ("Batch-invariant mode").
VariantChoice invariant_variant(const Problem &p, const DeviceProfile &device) {
  VariantChoice choice;
  choice.variant = SplitVariant::tensor_core;
  const bool long_splits = p.requested_split_tokens >= kInvariantWideMinSplitTokens && p.head_dim > 64;
  if (long_splits && !p.paged &&
      device.occupancy.ctas(SplitVariant::tensor_core_wide, p.kv_dtype, head_dim_bucket(p.head_dim)) > 0)
    choice.variant = SplitVariant::tensor_core_wide;
  return choice;
}

// The balanced schedule: per-sequence lengths, automatic splits, not batch
// invariant (its cut depends on the whole batch). Lengths on the device are
// what it is for: every CTA reads them and cuts the batch's real keys into
// equal runs, so long and short sequences finish together and nothing is
// planned from lengths on the host.
// Paged caches only: on dense ones the wide tiles' fixed schedule measured
// faster ("Balanced schedule").
bool balanced_schedule_takes(const Problem &p) {
  return FD_BALANCED_SCHEDULE && p.paged && p.has_seq_lens && p.requested_splits == 0 && !p.batch_invariant();
}

// Whether compact tiles take p (see kCompactMinUnitsPerSm): the balanced
// schedule's batches, head_dim up to 128, pages of kCompactMinPageSize or
// more, at least kCompactMinUnitsPerSm units (sequence, KV head, chunk of
// 16 rows) a multiprocessor, and a device that holds at least twice as many compact
// CTAs as standard ones (what they were measured with: four against two;
// their gain is the CTAs that overlap each other's fills).
bool compact_tiles_take(const Problem &p, const DeviceProfile &device) {
  const SplitVariant compact = SplitVariant::tensor_core_compact;
  if (!balanced_schedule_takes(p) || p.head_dim > 128 || p.page_size < kCompactMinPageSize) return false;
  const int bucket = head_dim_bucket(p.head_dim);
  const int standard_ctas = device.occupancy.ctas(SplitVariant::tensor_core, p.kv_dtype, bucket);
  if (device.occupancy.ctas(compact, p.kv_dtype, bucket) < std::max(1, 2 * standard_ctas)) return false;
  const int64_t units = p.batch * p.kv_heads * tile_heads(p.rows_per_kv_head(), shape_of(p, compact).rows).chunks;
  return units >= kCompactMinUnitsPerSm * device.sm_count;
}

// Whether the wide 64-row kernel takes a problem of 17-32 rows a KV head,
// which the 32-row kernel runs otherwise: it leaves half of wgmma's M empty
// but holds three times the bytes in flight of a 32-row CTA, and these
// kernels are bound by their copies; at one CTA a multiprocessor, though,
// each split's pipeline fill and epilogue run alone. So: fixed splits of at
// least kRowsWideMinSplitTiles tiles, all in one wave (tests/bench/policy.md,
// "Several query tokens": slower on splits of 16 tiles and on four waves,
// faster on 32-64 tiles in one). Not balanced schedules (no fixed splits) nor
// batch-invariant plans (whose kernel may not depend on the batch). Sets the
// automatic split estimate it took.
bool wide_rows_take_long_splits(const Problem &p, const DeviceProfile &device, VariantChoice &choice) {
  const SplitVariant wide = SplitVariant::tensor_core_rows64_wide;
  if (kRowsWideMinSplitTiles <= 0 || p.batch_invariant() || balanced_schedule_takes(p)) return false;
  SplitEstimate estimate;
  int64_t splits = p.requested_splits;
  if (splits <= 0) {
    estimate = estimate_splits(p, cost_model(p, wide, device));
    splits = estimate.splits;
  }
  const int64_t span = std::max<int64_t>(1, planned_kv_span(p));
  const int64_t split_tokens = ceil_div(span, std::max<int64_t>(1, splits));
  if (split_tokens < kRowsWideMinSplitTiles * shape_of(p, wide).tile_tokens) return false;
  const int64_t ctas = p.batch * p.kv_heads * ceil_div(span, split_tokens);
  if (ctas > resident_slots(p, wide, device)) return false;
  choice.variant = wide;
  choice.estimated = p.requested_splits <= 0;
  choice.estimate = estimate;
  return true;
}

// Over 16 query rows a KV head (several query tokens x the GQA group, or a
// group above 16): the rows kernels read each K/V tile once for up to 32
// (two m-tiles) or, above 32 rows, 64 of them (four), where the standard
// tiles' chunks of 16 rows would each stream the keys again
// (tests/bench/policy.md, "Rows kernels"). They score through the variants
// (plain scoring is their special case); which of them runs depends on no
// batch field but for 17-32 rows (wide_rows_take_long_splits, never in
// batch-invariant plans). Returns whether one takes p, and which.
bool rows_kernel_takes(const Problem &p, const DeviceProfile &device, VariantChoice &choice) {
  const int bucket = head_dim_bucket(p.head_dim);
  if (p.rows_per_kv_head() <= kRowsKernelMinRows ||
      device.occupancy.ctas(SplitVariant::tensor_core_rows, p.kv_dtype, bucket) == 0) {
    return false;
  }
  // Above 32 rows: the wide 64-row kernel where the device has it (sm_90:
  // twice the bytes in flight of the 64-row one, which bound these
  // kernels), else the 64-row one, else chunks of 32. Up to 32: the 32-row
  // kernel, or the wide one on long splits.
  const SplitVariant wide = SplitVariant::tensor_core_rows64_wide;
  const bool has_wide = device.occupancy.ctas(wide, p.kv_dtype, bucket) > 0;
  const bool above_two_tiles = p.rows_per_kv_head() > shape_of(p, SplitVariant::tensor_core_rows).rows;
  choice.variant = SplitVariant::tensor_core_rows;
  if (above_two_tiles && has_wide) {
    choice.variant = wide;
  } else if (above_two_tiles && device.occupancy.ctas(SplitVariant::tensor_core_rows64, p.kv_dtype, bucket) > 0) {
    choice.variant = SplitVariant::tensor_core_rows64;
  } else if (!above_two_tiles && has_wide) {
    wide_rows_take_long_splits(p, device, choice);
  }
  return true;
}

// Which split kernel a problem is planned for, from PlanKey fields alone.
// The tensor cores where they take the problem (but see
// kMhaCudaCoreMinWaves). Compact tiles for paged serving batches of many
// units (compact_tiles_take). Wide tiles where the device has them, for dense
// caches with automatic splits: with one length when the wave model expects
// them to finish sooner and their splits outgrow their pipeline, always with
// per-sequence lengths, whose waves of splits they stream faster. Paged
// caches measured slower with them ("Wide tensor-core tiles").
VariantChoice choose_split_variant(const Problem &p, const DeviceProfile &device) {
  VariantChoice choice;
  choice.variant = fallback_variant(p);
  if (!tensor_cores_take(p)) return choice;
  // 8-bit caches: the tensor cores, standard tiles, for every shape they
  // take (with one query row per KV head too: the CUDA-core kernel measured
  // no faster there); up to 8 rows a KV head with the
  // keys on the MMA's M, whose N of 8 they fill (half the MMAs and
  // accumulators of 16 row slots).
  if (p.kv_quantized) {
    const SplitVariant keys = SplitVariant::tensor_core_8bit_keys;
    const bool keys_take = p.rows_per_kv_head() <= kQ8KeysMaxRows &&
                           device.occupancy.ctas(keys, p.kv_dtype, head_dim_bucket(p.head_dim)) > 0;
    choice.variant = keys_take ? keys : SplitVariant::tensor_core_8bit;
    return choice;
  }
  choice.variant = SplitVariant::tensor_core;
  if (rows_kernel_takes(p, device, choice)) return choice;
  if (p.batch_invariant()) return invariant_variant(p, device);
  if (mha_bucket_128(p)) {
    const int64_t slots = resident_slots(p, choice.variant, device);
    if (p.batch * p.kv_heads >= kMhaCudaCoreMinWaves * slots) {
      choice.variant = SplitVariant::cuda_core;
      return choice;
    }
  }
  if (compact_tiles_take(p, device)) {
    choice.variant = SplitVariant::tensor_core_compact;
    return choice;
  }
  if (p.paged || p.requested_splits > 0) return choice;
  const SplitVariant wide = SplitVariant::tensor_core_wide;
  if (device.occupancy.ctas(wide, p.kv_dtype, head_dim_bucket(p.head_dim)) == 0) return choice;
  if (p.has_seq_lens) {  // the wave model has no lengths to compare them on
    choice.variant = wide;
    return choice;
  }
  const SplitEstimate wide_estimate = estimate_splits(p, cost_model(p, wide, device));
  if (!refills_pipeline(p, shape_of(p, wide), wide_estimate.splits)) return choice;
  const SplitEstimate standard_estimate = estimate_splits(p, cost_model(p, choice.variant, device));
  choice.estimated = true;
  if (wide_estimate.cost < standard_estimate.cost) {
    choice.variant = wide;
    choice.estimate = wide_estimate;
  } else {
    choice.estimate = standard_estimate;
  }
  return choice;
}

// Whether the splits of each unit can merge as one thread-block cluster
// (SplitParams::cluster_merge): a variant with cluster kernels on this
// device, 2..kMaxClusterSplits splits, every sequence as long as the cache
// (a cluster holds its multiprocessors until its longest split is done: with
// per-sequence lengths, the empty and short splits would wait there), and
// the grid of `ctas` needs no more waves in clusters than without them (a
// cluster's CTAs share one GPC, which can leave multiprocessors idle).
bool cluster_merge_fits(const Problem &p, SplitVariant variant, int splits, int64_t ctas, const DeviceProfile &device) {
  if (!FD_CLUSTER_MERGE || p.has_seq_lens || needs_variant_scores(p)) return false;
  if (splits < 2 || splits > kMaxClusterSplits) return false;
  const int clusters = device.occupancy.clusters(variant, p.kv_dtype, head_dim_bucket(p.head_dim), splits);
  if (clusters == 0) return false;
  const int64_t slots = resident_slots(p, variant, device);
  return ceil_div(ctas, static_cast<int64_t>(clusters) * splits) <= ceil_div(ctas, slots);
}

}  // namespace

// Per-row key ranges (several query tokens under a causal mask or a
// window, or ragged query lengths, whose padding tokens see no key), a
// softcap or ALiBi: the kernels built with kVariants. Anything else (one
// token, or several that all see the same keys; sinks, which the epilogue
// adds) runs the plain kernels.
bool needs_variant_scores(const Problem &p) {
  return (p.q_len > 1 && (p.causal || p.window > 0)) || p.has_q_lens || p.softcap > 0.0f || p.has_alibi;
}

bool rows_aligned(const StridedView &view, size_t element_bytes, uintptr_t alignment) {
  if (reinterpret_cast<uintptr_t>(view.data) % alignment != 0) return false;
  for (int d = 0; d < 3; ++d) {
    if (view.shape[d] > 1 && (static_cast<uint64_t>(view.strides[d]) * element_bytes) % alignment != 0) return false;
  }
  return true;
}

namespace {

// Whether the tensor-core kernel's paged loader (32-bit page and slot byte
// offsets, widened once; TileLoader in prims/load.cuh) can address this pool
// and table: a page's byte stride, the bytes of a page's slots and the block
// table's column offsets all below 2^31. Always true for pools laid out as
// [page, slot, head, dim] or [page, head, slot, dim] with pages under 2 GiB.
bool paged_fits_32bit(const Problem &p) {
  constexpr int64_t kLimit = int64_t{1} << 31;
  const int64_t bytes = static_cast<int64_t>(dtype_bytes(p.kv_dtype));
  const StridedView *caches[2] = {&p.k, &p.v};
  // Compared by division: a dimension of extent 1 may carry any stride, so
  // the products could overflow.
  for (const StridedView *cache : caches) {
    if (cache->strides[0] >= kLimit / bytes || cache->strides[1] >= kLimit / bytes / p.page_size) return false;
  }
  return p.block_table.strides[1] == 0 || p.block_table.shape[1] < kLimit / p.block_table.strides[1];
}

// Its workers: every CTA of `variant` the device holds at once.
int64_t balanced_workers(const Problem &p, SplitVariant variant, const DeviceProfile &device) {
  return int64_t{FD_BALANCED_WAVES} * resident_slots(p, variant, device);
}

// Its group size: the largest divisor of a sequence's units, up to
// FD_BALANCED_MAX_GROUP, whose whole groups keep all but 1/64 of the
// workers (5 KV heads on 528 workers: groups of 5, 525 workers; 32 units:
// 16, since groups of 32 would idle 16 of 528).
int32_t balanced_group(int64_t units_per_sequence, int64_t workers) {
  for (int64_t g = std::min<int64_t>(FD_BALANCED_MAX_GROUP, units_per_sequence); g > 1; --g) {
    if (units_per_sequence % g == 0 && (workers / g) * g * 64 >= workers * 63) return static_cast<int32_t>(g);
  }
  return 1;
}

// The partial states it needs on `variant`: two slots a worker of a chunk's rows.
int64_t balanced_states(const Problem &p, SplitVariant variant, const DeviceProfile &device) {
  const HeadTiling heads = tile_heads(p.rows_per_kv_head(), shape_of(p, variant).rows);
  return 2 * balanced_workers(p, variant, device) * heads.heads_per_chunk;
}

// Whether the fixed splits of a launch of `units` are fitted to the lengths
// on the device (choose_launch): paged batches with lengths, on automatic
// splits, of fewer units than the device runs CTAs at once.
bool splits_fit_lengths(const Problem &p, int64_t units, int64_t slots) {
  return p.paged && p.has_seq_lens && p.requested_splits == 0 && !p.batch_invariant() && units < slots;
}

}  // namespace

Plan plan_decode(const Problem &p, const DeviceProfile &device) {
  const VariantChoice choice = choose_split_variant(p, device);
  const SplitCostModel model = cost_model(p, choice.variant, device);
  int32_t automatic = p.requested_splits > 0 || p.batch_invariant() ? 0
                      : choice.estimated                            ? choice.estimate.splits
                                                                    : estimate_splits(p, model).splits;
  // Splits fitted to the lengths leave at most one wave of pieces with
  // keys, so a sequence's units (KV heads x chunks) never use more than a
  // wave's share each: more would only be CTAs with nothing to attend.
  const int64_t units_per_sequence =
      p.kv_heads * tile_heads(p.rows_per_kv_head(), shape_of(p, choice.variant).rows).chunks;
  const int64_t slots = resident_slots(p, choice.variant, device);
  if (splits_fit_lengths(p, p.batch * units_per_sequence, slots)) {
    automatic = static_cast<int32_t>(std::min<int64_t>(automatic, ceil_div(slots, units_per_sequence)));
  }
  // The balanced schedule's slots, for the planned variant and the one
  // launch falls back to (choose_launch); the fixed split count stays
  // planned for launches that cannot balance.
  int64_t min_states = 0;
  if (balanced_schedule_takes(p)) {
    min_states = std::max(balanced_states(p, choice.variant, device), balanced_states(p, fallback_variant(p), device));
  }
  Plan plan =
      layout_plan(p, automatic, model.split_granularity, kWorkspaceHeaderBytes, static_cast<size_t>(min_states));
  if (may_order_sequences(p, plan.num_splits)) add_scratch(plan, static_cast<size_t>(p.batch) * sizeof(int32_t), 1);
  plan.kernel_variant = static_cast<uint8_t>(index_of(choice.variant));
  return plan;
}

LaunchChoice choose_launch(const Problem &p, const Plan &plan, const DeviceProfile &device) {
  LaunchChoice launch;
  launch.variant = split_variant_at(plan.kernel_variant);
  const size_t element_bytes = dtype_bytes(p.kv_dtype);
  // 16-byte cp.async copies of every K/V row.
  launch.aligned = rows_aligned(p.k, element_bytes) && rows_aligned(p.v, element_bytes);
  if (!launch.aligned || (p.paged && !paged_fits_32bit(p))) launch.variant = fallback_variant(p);
  const SplitKernelShape shape = shape_of(p, launch.variant);
  launch.heads = tile_heads(p.rows_per_kv_head(), shape.rows);
  launch.variant_scores = needs_variant_scores(p) || split_variant_scores_only(launch.variant);
  launch.units = p.batch * p.kv_heads * launch.heads.chunks;
  // Balanced where every unit has a merge counter (plan_decode sized the
  // slots for this variant), the units are few waves and not so few that
  // each is cut into many pieces.
  const int64_t workers = balanced_workers(p, launch.variant, device);
  const int64_t max_unit_waves =
      launch.variant == SplitVariant::tensor_core_compact ? kCompactBalancedMaxUnitWaves : kBalancedMaxUnitWaves;
  if (balanced_schedule_takes(p) && launch.units <= kMergeCounterSlots && launch.units < max_unit_waves * workers &&
      launch.units * kBalancedMaxPiecesPerUnit >= workers) {
    launch.balanced_group = balanced_group(p.kv_heads * launch.heads.chunks, workers);
    launch.balanced_workers = static_cast<int32_t>(workers / launch.balanced_group * launch.balanced_group);
    launch.piece_overhead_tiles = static_cast<int32_t>(ceil_div(kPieceOverheadTokens, shape.tile_tokens));
    launch.merge = FD_MERGE_FUSED;
    return launch;
  }
  const int64_t slots = resident_slots(p, launch.variant, device);
  const int64_t ctas = launch.units * plan.num_splits;
  launch.longest_first = may_order_sequences(p, plan.num_splits) && ctas > slots &&
                         plan.split_tokens * slots >= kLongestFirstMinSplitTokensPerWave * ctas;
  if (plan.num_splits == 1) return launch;
  // Paged batches of fewer units than the device runs CTAs at once, on
  // automatic fixed splits (the fewest-unit batches, kBalancedMaxPiecesPerUnit):
  // the kernel fits the split length to the lengths on the device, not the
  // capacity, which is often far longer (a block table sized for the longest
  // context an engine allows), and skips the splits past the longest
  // sequence's; the merge kernel merges only those in use (the fused merge's
  // per-CTA count-in measured slower on such short splits). The cut leaves
  // at most one wave of pieces with keys, each as long as the lengths allow
  // (a unit of the target per sequence's unit: ceil rounding adds at most
  // one piece a unit). Two or more sequences run on a grid of that one wave,
  // CTA g taking piece g: on the planned grid the later sequences' splits
  // waited behind the earlier ones' empty CTAs. One sequence keeps the
  // planned grid, whose CTAs are already in its splits' order, and the
  // shorter start ("Fitted splits"). Each CTA reads every length, so only
  // batches this small. Dense caches keep the capacity's cut: fitted and
  // merged apart, ragged dense shape 9 ran 1.8% slower.
  if (splits_fit_lengths(p, launch.units, slots)) {
    launch.fitted_split_floor = static_cast<int32_t>(kMinSplitTokens);
    launch.fitted_target_ctas = static_cast<int32_t>(slots - launch.units);
    launch.longest_first = false;  // the fitted grid hands out its own pieces
    if (p.batch > 1)
      launch.fitted_ctas = static_cast<int32_t>(std::min<int64_t>(slots, launch.units * plan.num_splits));
    launch.merge = FD_MERGE_SEPARATE;
    return launch;
  }
  // Batch-invariant plans merge several splits in the merge kernel, whose
  // order of sums they fix: the fused and cluster merges order them
  // differently, and which of them runs would depend on the batch. One
  // split writes the output itself, with the bits the merge kernel gives a
  // single non-empty split (weight exp2(0) = 1, sums from +0).
  if (p.batch_invariant()) {
    launch.merge = FD_MERGE_SEPARATE;
    return launch;
  }
  // In clusters where they fit, else fused into the split kernel where a
  // unit's partials fit, else the merge kernel.
  const int64_t unit_states = static_cast<int64_t>(launch.heads.heads_per_chunk) * plan.num_splits;
  const bool fused = launch.units <= kMergeCounterSlots &&
                     unit_states * p.head_dim * static_cast<int64_t>(sizeof(float)) <= kFusedMergeMaxBytes &&
                     fused_merge_smem_bytes(unit_states, p.head_dim, shape.threads) <= shape.usable_smem_bytes;
  if (cluster_merge_fits(p, launch.variant, plan.num_splits, launch.units * plan.num_splits, device)) {
    launch.merge = FD_MERGE_CLUSTER;
  } else {
    launch.merge = fused ? FD_MERGE_FUSED : FD_MERGE_SEPARATE;
  }
  return launch;
}

LaunchSummary summarize(const Problem &p, const Plan &plan, const LaunchChoice &launch) {
  LaunchSummary summary;
  summary.kernel = split_variant_name(launch.variant, head_dim_bucket(p.head_dim));
  summary.merge = launch.merge;
  summary.launches = (launch.merge == FD_MERGE_SEPARATE ? 2 : 1) + (launch.longest_first ? 1 : 0);
  summary.blocks = launch.balanced_workers > 0 ? launch.balanced_workers
                   : launch.fitted_ctas > 0    ? launch.fitted_ctas
                                               : launch.units * plan.num_splits;
  if (launch.balanced_workers > 0) summary.device_cut_tokens = shape_of(p, launch.variant).tile_tokens;
  summary.schedule = launch.balanced_workers > 0     ? FD_SCHEDULE_BALANCED
                     : launch.fitted_split_floor > 0 ? FD_SCHEDULE_FITTED
                     : launch.longest_first          ? FD_SCHEDULE_LONGEST_FIRST
                                                     : FD_SCHEDULE_FIXED;
  return summary;
}

}  // namespace cuda
}  // namespace fd
