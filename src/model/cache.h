// Cache: the state of every sequence in flight, in pools owned by one object (MODEL.md 8 "Decode
// state"; docs/DESIGN.md "One step, many sequences").
//
// KDA layers keep per-slot pools: the recurrent state [slots, H, dk, dv] (F32, K-first) and the
// conv state [slots, Kc−1, 3P] (the last pre-conv q/k/v rows). MLA layers keep the latent cache in
// fixed-size pages [pages, page_size, c+r] (kv_a_layernorm output ‖ k_r of each position), shared
// by index across the MLA layers, with one page table per sequence. AttnRes keeps nothing.
//
// Both pools are sized once, from a memory budget, when the cache is created; a sequence takes a
// slot when it opens and pages as it grows (reserve), and gives both back when it closes. Who
// decides which sequence may grow is not the cache's business: the serving scheduler reserves
// while it schedules (runtime/cache_manager.h), a single-sequence caller reserves its step. A
// step is then laid out here (plan(), which allocates nothing and so cannot run out of room) and
// run by Model::forward, which advances the sequences only when it succeeds.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "backend/backend.h"
#include "io/config.h"

namespace klinear {

// A sequence's handle: its record's index in the low 32 bits, the record's generation (how often
// the index was handed out before) above, so an index is reused without a stale handle ever
// reaching the new sequence's state.
using SeqId = int64_t;

enum class LogitsMode { kLast, kAll };  // logits of a sequence's last new token, or of every one

struct CacheOptions {
  int64_t max_sequences = 1;  // KDA state slots
  int64_t page_size = 64;     // positions per MLA page
  // Budget for both pools in bytes; 0 = room for max_sequences at the model's full context (4096
  // positions when the config gives none), capped at a quarter of the backend's free memory.
  uint64_t memory_bytes = 0;
};

// Positions per MLA page at most (a page of the 48B model's 576-wide latent is then 4.7 MB a layer
// in bf16); every command that takes --page-size checks it with check_page_size before loading.
inline constexpr int64_t kMaxPageSize = 4096;
Status check_page_size(int64_t page_size);

// What the pools hold, for start-up reports and admission decisions.
struct CacheSizes {
  uint64_t bytes_per_slot = 0;   // KDA + conv state of one sequence, all layers
  uint64_t bytes_per_page = 0;   // one page of every MLA layer
  int64_t slots = 0;
  int64_t pages = 0;             // 0 when the model has no MLA layer
  int64_t page_size = 0;
  uint64_t bytes() const { return bytes_per_slot * slots + bytes_per_page * pages; }
};
// The bytes of one slot and one page of `config`'s caches (no slots or pages counted yet).
CacheSizes cache_unit_sizes(const ModelConfig& config, DType activation, int64_t page_size);

// Copy the KDA and conv state of a sequence, as it stands after `after` of its new tokens, into
// `slot` (a slot from take_slot) while the step runs: the snapshots of prefix caching. `after` is
// a multiple of 64 (a KDA chunk boundary, so no prefill is split for it) or the step's last token.
struct Snapshot {
  int64_t after = 0;
  int64_t slot = 0;
};

// One sequence's part of a step.
struct SeqStep {
  SeqId seq = 0;
  std::span<const int32_t> ids;
  LogitsMode logits = LogitsMode::kLast;
  std::span<const Snapshot> snapshots = {};
};

// A planned step: the new ids of every sequence concatenated, their layout, and the rows whose
// logits Model::forward returns. Decoding sequences (one new token after earlier ones) come first,
// so the step splits into two parts of consecutive rows: `decode` (recurrent KDA, absorbed MLA)
// and `prefill` (chunked KDA, expanded MLA); either may be empty. A sequence thus takes the same
// path whatever else shares its step.
struct Batch {
  std::vector<SeqId> seqs;          // [B] in layout order
  std::vector<int32_t> ids;         // [N]
  SeqLayout layout;                 // all B sequences
  int64_t num_decode = 0;           // sequences [0, num_decode) of the layout decode
  SeqLayout decode, prefill;        // layout.part(0, num_decode) and layout.part(num_decode, B)
  std::vector<int32_t> logit_rows;  // [R] in the order of the steps given to plan, row by row
};

class Cache {
 public:
  // Allocates the pools on `backend` (which must outlive the cache). Errors name the budget and
  // what one slot needs when not even max_sequences slots fit.
  static Result<std::unique_ptr<Cache>> create(const ModelConfig& config, Backend& backend, const CacheOptions& options);

  // A new sequence with zero state and no pages; ResourceExhausted when every slot is taken.
  Result<SeqId> open();
  // Returns the sequence's slot and pages. The id must be open.
  void close(SeqId seq);
  bool is_open(SeqId seq) const;
  int64_t tokens(SeqId seq) const;  // positions already in its state
  int64_t slot(SeqId seq) const;
  const std::vector<int32_t>& pages(SeqId seq) const;

  const CacheSizes& sizes() const { return sizes_; }
  int64_t free_slots() const { return static_cast<int64_t>(free_slots_.size()); }
  int64_t free_pages() const { return static_cast<int64_t>(free_pages_.size()); }

  // Pools by layer (undefined for layers of the other mixer).
  const Tensor& kda_states(int64_t layer) const { return kda_states_[layer]; }
  const Tensor& conv_states(int64_t layer) const { return conv_states_[layer]; }
  const Tensor& mla_pages(int64_t layer) const { return mla_pages_[layer]; }

  // Copies the KDA and conv state of slot `from` into slot `to` in every KDA layer.
  void copy_slot(int64_t from, int64_t to);

  // Slots held outside any sequence (prefix-cache snapshots): take one (ResourceExhausted when
  // none is free) and give it back.
  Result<int64_t> take_slot();
  void release_slot(int64_t slot);

  // MLA pages are reference counted: a sequence holds one reference on each of its pages, and a
  // prefix cache may hold more (retain/release), so a page returns to the free list only when its
  // last holder lets go. A page held more than once is never written (see adopt).
  void retain_page(int32_t page);
  void release_page(int32_t page);
  int64_t page_refs(int32_t page) const { return page_refs_[page]; }

  // Starts the fresh sequence `seq` (no tokens yet) from a cached prefix of `tokens` positions:
  // its state is copied from `snapshot_slot` (the KDA and conv state after exactly `tokens`
  // positions), its first tokens / page_size pages become `pages` (shared, retained), and the
  // positions of a last partial page are copied into a page of its own, so the sequence never
  // writes a shared page. `pages` must cover [0, tokens).
  Status adopt(SeqId seq, int64_t tokens, int64_t snapshot_slot, std::span<const int32_t> pages);

  // Fixed-size decode steps (docs/DESIGN.md "The decode step as a CUDA graph"). The pools hold
  // one state slot and one page more than sizes() counts, never handed out: the rows that pad a
  // step run in them, so they touch no sequence's state.
  int64_t scratch_slot() const { return sizes_.slots; }
  // Columns of a padded step's page table: the most pages one sequence can hold (0 without MLA).
  int64_t max_pages_per_seq() const;
  // Pads a decode-only batch from plan() (no snapshots) to `seqs` sequences: each added one
  // decodes token 0 at position 0 of the scratch slot and page, its logits row after the batch's;
  // the page table gets `cols` columns (at least the batch's, at most max_pages_per_seq()).
  // advance() leaves the added ones out.
  void pad(Batch& batch, int64_t seqs, int64_t cols) const;

  // Makes `seq` hold the pages of its first `positions` positions (taking free pages; never
  // giving any back). ResourceExhausted, changing nothing, when too few are free; InvalidArgument
  // past the model's context.
  Status reserve(SeqId seq, int64_t positions);
  // The pages a reserve(seq, positions) would take.
  int64_t pages_short(SeqId seq, int64_t positions) const;
  // Reserves what `steps` need (each sequence's tokens plus its new ids): all or none.
  Status reserve(std::span<const SeqStep> steps);

  // Validates a step (open sequences, each at most once, at least one id each, ids inside the
  // vocabulary, positions inside the context, pages reserved for every new position, snapshots
  // at allowed positions into taken slots) and lays out the batch. Takes nothing from the pools.
  Result<Batch> plan(std::span<const SeqStep> steps) const;
  // Marks the batch's tokens as processed (Model::forward, after a successful step).
  void advance(const Batch& batch);

 private:
  struct Sequence {
    bool open = false;
    uint32_t generation = 0;  // handles given out for this record before
    int64_t slot = -1;
    int64_t tokens = 0;
    std::vector<int32_t> pages;
  };
  Cache(const ModelConfig& config, Backend& backend);
  Sequence& get(SeqId seq);
  const Sequence& get(SeqId seq) const;

  ModelConfig config_;
  Backend& backend_;
  CacheSizes sizes_;
  std::vector<Tensor> kda_states_, conv_states_, mla_pages_;  // by layer
  std::vector<Sequence> seqs_;                                // by SeqId's index
  std::vector<uint32_t> free_records_;                        // indices of closed records
  std::vector<int64_t> free_slots_;
  std::vector<bool> detached_;         // by slot: taken with take_slot
  std::vector<int32_t> free_pages_;
  std::vector<int32_t> page_refs_;     // by page
};

}  // namespace klinear
