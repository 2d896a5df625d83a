#include "model/cache.h"

#include <algorithm>
#include <string>

namespace klinear {

namespace {
std::string mib(uint64_t b) { return std::to_string((b + (1u << 20) - 1) >> 20) + " MiB"; }
}  // namespace

SeqLayout SeqLayout::part(int64_t b0, int64_t b1) const {
  SeqLayout p;
  p.page_size = page_size;
  p.max_pages = max_pages;
  for (int64_t b = b0; b <= b1; ++b) p.cu_seqlens.push_back(cu_seqlens[b] - cu_seqlens[b0]);
  p.cached.assign(cached.begin() + b0, cached.begin() + b1);
  p.slots.assign(slots.begin() + b0, slots.begin() + b1);
  p.page_table.assign(page_table.begin() + b0 * max_pages, page_table.begin() + b1 * max_pages);
  for (size_t k = 0; k < snap_seq.size(); ++k) {
    if (snap_seq[k] < b0 || snap_seq[k] >= b1) continue;
    p.snap_seq.push_back(static_cast<int32_t>(snap_seq[k] - b0));
    p.snap_pos.push_back(snap_pos[k]);
    p.snap_slot.push_back(snap_slot[k]);
  }
  return p;
}

Cache::Cache(const ModelConfig& config, Backend& backend) : config_(config), backend_(backend) {}

Status check_page_size(int64_t page_size) {
  if (page_size < 1 || page_size > kMaxPageSize)
    return Status::InvalidArgument("page size (--page-size) " + std::to_string(page_size) + " is outside [1, " +
                                   std::to_string(kMaxPageSize) + "]");
  return {};
}

CacheSizes cache_unit_sizes(const ModelConfig& c, DType activation, int64_t page_size) {
  const uint64_t act = dtype_size(activation);
  const int64_t P = c.kda_proj(), latent = c.kv_lora_rank + c.qk_rope_dim;
  int64_t kda_layers = 0, mla_layers = 0;
  for (int64_t l = 0; l < c.num_layers; ++l) (c.mixer(l) == Mixer::kKda ? kda_layers : mla_layers)++;
  CacheSizes s;
  s.page_size = page_size;
  s.bytes_per_slot = kda_layers * (static_cast<uint64_t>(c.kda_heads * c.kda_head_dim * c.kda_head_dim) * 4 +
                                   static_cast<uint64_t>((c.conv_kernel - 1) * 3 * P) * act);
  s.bytes_per_page = mla_layers * static_cast<uint64_t>(page_size * latent) * act;
  return s;
}

Result<std::unique_ptr<Cache>> Cache::create(const ModelConfig& c, Backend& be, const CacheOptions& o) {
  if (o.max_sequences < 1)
    return Status::InvalidArgument("cache: max_sequences (" + std::to_string(o.max_sequences) + ") must be at least 1");
  KL_RETURN_IF_ERROR(check_page_size(o.page_size));
  std::unique_ptr<Cache> cache(new Cache(c, be));
  CacheSizes& s = cache->sizes_;
  s = cache_unit_sizes(c, be.activation_dtype(), o.page_size);

  const int64_t context = c.max_position_embeddings > 0 ? c.max_position_embeddings : 4096;
  const int64_t pages_per_seq = (context + o.page_size - 1) / o.page_size;
  uint64_t budget = o.memory_bytes;
  if (budget == 0)
    budget = std::min<uint64_t>(o.max_sequences * (s.bytes_per_slot + pages_per_seq * s.bytes_per_page),
                                be.available_bytes() / 4);
  const uint64_t slot_bytes = o.max_sequences * s.bytes_per_slot;
  if (slot_bytes > budget || (s.bytes_per_page > 0 && budget - slot_bytes < s.bytes_per_page))
    return Status::ResourceExhausted("cache: " + std::to_string(o.max_sequences) + " sequences need " + mib(slot_bytes) +
                                     " of KDA state plus at least one " + mib(s.bytes_per_page) +
                                     " MLA page, the budget is " + mib(budget));
  s.slots = o.max_sequences;
  s.pages = s.bytes_per_page == 0 ? 0 : static_cast<int64_t>((budget - slot_bytes) / s.bytes_per_page);
  s.pages = std::min<int64_t>(s.pages, static_cast<int64_t>(o.max_sequences) * pages_per_seq);

  cache->kda_states_.resize(c.num_layers);
  cache->conv_states_.resize(c.num_layers);
  cache->mla_pages_.resize(c.num_layers);
  // One scratch slot and page past the counted ones (the padding of fixed-size decode steps).
  for (int64_t l = 0; l < c.num_layers; ++l) {
    if (c.mixer(l) == Mixer::kKda) {
      cache->kda_states_[l] = be.alloc_persistent(DType::kF32, {s.slots + 1, c.kda_heads, c.kda_head_dim, c.kda_head_dim});
      cache->conv_states_[l] = be.alloc_persistent(be.activation_dtype(), {s.slots + 1, c.conv_kernel - 1, 3 * c.kda_proj()});
    } else if (s.pages > 0) {
      cache->mla_pages_[l] = be.alloc_persistent(be.activation_dtype(), {s.pages + 1, o.page_size, c.kv_lora_rank + c.qk_rope_dim});
    }
  }
  for (int64_t i = s.slots - 1; i >= 0; --i) cache->free_slots_.push_back(i);
  for (int64_t i = s.pages - 1; i >= 0; --i) cache->free_pages_.push_back(static_cast<int32_t>(i));
  cache->detached_.assign(static_cast<size_t>(s.slots), false);
  cache->page_refs_.assign(static_cast<size_t>(s.pages), 0);
  return cache;
}

namespace {
constexpr SeqId handle(uint32_t index, uint32_t generation) { return static_cast<SeqId>(generation) << 32 | index; }
constexpr uint32_t index_of(SeqId seq) { return static_cast<uint32_t>(seq & 0xffffffff); }
}  // namespace

bool Cache::is_open(SeqId seq) const {
  return seq >= 0 && index_of(seq) < seqs_.size() && seqs_[index_of(seq)].open &&
         handle(index_of(seq), seqs_[index_of(seq)].generation) == seq;
}

Cache::Sequence& Cache::get(SeqId seq) {
  KL_CHECK(is_open(seq), "sequence " + std::to_string(seq) + " is not open");
  return seqs_[index_of(seq)];
}
const Cache::Sequence& Cache::get(SeqId seq) const { return const_cast<Cache*>(this)->get(seq); }

int64_t Cache::tokens(SeqId seq) const { return get(seq).tokens; }
int64_t Cache::slot(SeqId seq) const { return get(seq).slot; }
const std::vector<int32_t>& Cache::pages(SeqId seq) const { return get(seq).pages; }

Result<SeqId> Cache::open() {
  if (free_slots_.empty())
    return Status::ResourceExhausted("cache: all " + std::to_string(sizes_.slots) + " sequence slots are in use");
  if (free_records_.empty()) {
    free_records_.push_back(static_cast<uint32_t>(seqs_.size()));
    seqs_.emplace_back();
  }
  const uint32_t index = free_records_.back();
  free_records_.pop_back();
  Sequence& s = seqs_[index];
  s.open = true;
  s.slot = free_slots_.back();
  free_slots_.pop_back();
  for (int64_t l = 0; l < config_.num_layers; ++l) {
    if (!kda_states_[l].defined()) continue;
    backend_.fill(kda_states_[l].rows(s.slot, s.slot + 1), 0.0f);
    backend_.fill(conv_states_[l].rows(s.slot, s.slot + 1), 0.0f);
  }
  return handle(index, s.generation);
}

void Cache::close(SeqId seq) {
  Sequence& s = get(seq);
  free_slots_.push_back(s.slot);
  for (auto p = s.pages.rbegin(); p != s.pages.rend(); ++p) release_page(*p);
  const uint32_t generation = s.generation + 1;  // the old handle no longer matches
  s = Sequence{};
  s.generation = generation;
  free_records_.push_back(index_of(seq));
}

Result<int64_t> Cache::take_slot() {
  if (free_slots_.empty())
    return Status::ResourceExhausted("cache: all " + std::to_string(sizes_.slots) + " state slots are in use");
  const int64_t slot = free_slots_.back();
  free_slots_.pop_back();
  detached_[slot] = true;
  return slot;
}

void Cache::release_slot(int64_t slot) {
  KL_CHECK(slot >= 0 && slot < sizes_.slots && detached_[slot], "slot " + std::to_string(slot) + " was not taken");
  detached_[slot] = false;
  free_slots_.push_back(slot);
}

void Cache::retain_page(int32_t page) {
  KL_CHECK(page >= 0 && page < sizes_.pages && page_refs_[page] > 0, "retain of a free page");
  ++page_refs_[page];
}

void Cache::release_page(int32_t page) {
  KL_CHECK(page >= 0 && page < sizes_.pages && page_refs_[page] > 0, "release of a free page");
  if (--page_refs_[page] == 0) free_pages_.push_back(page);
}

Status Cache::adopt(SeqId seq, int64_t tokens, int64_t snapshot_slot, std::span<const int32_t> pages) {
  Sequence& s = get(seq);
  const int64_t ps = sizes_.page_size;
  const int64_t needed = sizes_.bytes_per_page > 0 ? (tokens + ps - 1) / ps : 0;
  if (s.tokens != 0 || tokens < 1 || static_cast<int64_t>(pages.size()) < needed)
    return Status::InvalidArgument("adopt: sequence " + std::to_string(seq) + " must be fresh and " +
                                   std::to_string(pages.size()) + " pages must cover " + std::to_string(tokens) +
                                   " positions");
  if (snapshot_slot < 0 || snapshot_slot >= sizes_.slots || !detached_[snapshot_slot])
    return Status::InvalidArgument("adopt: slot " + std::to_string(snapshot_slot) + " is not a taken snapshot slot");
  for (int64_t i = 0; i < needed; ++i)
    if (pages[i] < 0 || pages[i] >= sizes_.pages || page_refs_[pages[i]] == 0)
      return Status::InvalidArgument("adopt: page " + std::to_string(pages[i]) + " is not held");
  const bool partial = tokens % ps != 0 && needed > 0;
  if (partial && free_pages_.empty())
    return Status::ResourceExhausted("cache: no free MLA page for the partial page of a cached prefix");
  for (int64_t i = 0; i < needed - (partial ? 1 : 0); ++i) {
    retain_page(pages[i]);
    s.pages.push_back(pages[i]);
  }
  if (partial) {
    const int32_t own = free_pages_.back();
    free_pages_.pop_back();
    page_refs_[own] = 1;
    for (const Tensor& pool : mla_pages_)
      if (pool.defined()) backend_.copy(pool.rows(pages[needed - 1], pages[needed - 1] + 1), pool.rows(own, own + 1));
    s.pages.push_back(own);
  }
  copy_slot(snapshot_slot, s.slot);
  s.tokens = tokens;
  return Status();
}

void Cache::copy_slot(int64_t from, int64_t to) {
  KL_CHECK(from >= 0 && from < sizes_.slots && to >= 0 && to < sizes_.slots, "copy_slot out of range");
  for (int64_t l = 0; l < config_.num_layers; ++l) {
    if (!kda_states_[l].defined()) continue;
    backend_.copy(kda_states_[l].rows(from, from + 1), kda_states_[l].rows(to, to + 1));
    backend_.copy(conv_states_[l].rows(from, from + 1), conv_states_[l].rows(to, to + 1));
  }
}

int64_t Cache::pages_short(SeqId seq, int64_t positions) const {
  if (sizes_.bytes_per_page == 0) return 0;
  return std::max<int64_t>(0, (positions + sizes_.page_size - 1) / sizes_.page_size -
                                  static_cast<int64_t>(get(seq).pages.size()));
}

Status Cache::reserve(SeqId seq, int64_t positions) {
  Sequence& s = get(seq);
  if (config_.max_position_embeddings > 0 && positions > config_.max_position_embeddings)
    return Status::InvalidArgument("sequence of " + std::to_string(positions) + " tokens exceeds the model's context of " +
                                   std::to_string(config_.max_position_embeddings) + " tokens");
  const int64_t short_by = pages_short(seq, positions);
  if (short_by > free_pages())
    return Status::ResourceExhausted("cache: sequence " + std::to_string(seq) + " needs " + std::to_string(short_by) +
                                     " more MLA pages of " + std::to_string(sizes_.page_size) + " positions, " +
                                     std::to_string(free_pages()) + " of " + std::to_string(sizes_.pages) + " are free");
  for (int64_t i = 0; i < short_by; ++i) {
    s.pages.push_back(free_pages_.back());
    page_refs_[free_pages_.back()] = 1;
    free_pages_.pop_back();
  }
  return Status();
}

Status Cache::reserve(std::span<const SeqStep> steps) {
  int64_t short_by = 0;
  for (const SeqStep& st : steps) {
    if (!is_open(st.seq)) return Status::InvalidArgument("sequence " + std::to_string(st.seq) + " is not open");
    short_by += pages_short(st.seq, get(st.seq).tokens + static_cast<int64_t>(st.ids.size()));
  }
  if (short_by > free_pages())
    return Status::ResourceExhausted("cache: the step needs " + std::to_string(short_by) + " more MLA pages of " +
                                     std::to_string(sizes_.page_size) + " positions, " + std::to_string(free_pages()) +
                                     " of " + std::to_string(sizes_.pages) + " are free");
  for (const SeqStep& st : steps)
    KL_RETURN_IF_ERROR(reserve(st.seq, get(st.seq).tokens + static_cast<int64_t>(st.ids.size())));
  return Status();
}

Result<Batch> Cache::plan(std::span<const SeqStep> steps) const {
  if (steps.empty()) return Status::InvalidArgument("step: no sequences");
  const int64_t ps = sizes_.page_size;
  int64_t max_pages = 0;
  std::vector<SeqId> seen;
  std::vector<int64_t> snap_slots;
  for (const SeqStep& st : steps) {
    const std::string who = "sequence " + std::to_string(st.seq);
    if (!is_open(st.seq)) return Status::InvalidArgument(who + " is not open");
    if (std::find(seen.begin(), seen.end(), st.seq) != seen.end())
      return Status::InvalidArgument(who + " appears twice in one step");
    seen.push_back(st.seq);
    if (st.ids.empty()) return Status::InvalidArgument(who + ": no tokens to run");
    for (size_t i = 0; i < st.ids.size(); ++i)
      if (st.ids[i] < 0 || st.ids[i] >= config_.vocab_size)
        return Status::InvalidArgument("token id " + std::to_string(st.ids[i]) + " at position " + std::to_string(i) +
                                       " is outside the vocabulary [0, " + std::to_string(config_.vocab_size) + ")");
    const Sequence& s = get(st.seq);
    const int64_t end = s.tokens + static_cast<int64_t>(st.ids.size());
    if (config_.max_position_embeddings > 0 && end > config_.max_position_embeddings)
      return Status::InvalidArgument("sequence of " + std::to_string(end) + " tokens exceeds the model's context of " +
                                     std::to_string(config_.max_position_embeddings) + " tokens");
    if (sizes_.bytes_per_page > 0) {
      const int64_t want = (end + ps - 1) / ps;
      if (static_cast<int64_t>(s.pages.size()) < want)
        return Status::InvalidArgument(who + " holds " + std::to_string(s.pages.size()) + " pages, its step needs " +
                                       std::to_string(want) + " (reserve them first)");
      max_pages = std::max(max_pages, want);
    }
    const int64_t n = static_cast<int64_t>(st.ids.size());
    for (const Snapshot& snap : st.snapshots) {
      if (snap.after < 1 || snap.after > n || (snap.after % 64 != 0 && snap.after != n))
        return Status::InvalidArgument(who + ": a snapshot after " + std::to_string(snap.after) + " of " +
                                       std::to_string(n) + " new tokens is not at a 64-token chunk boundary or the end");
      if (snap.slot < 0 || snap.slot >= sizes_.slots || !detached_[snap.slot] ||
          std::find(snap_slots.begin(), snap_slots.end(), snap.slot) != snap_slots.end())
        return Status::InvalidArgument(who + ": snapshot slot " + std::to_string(snap.slot) +
                                       " is not a taken slot (or is used twice in the step)");
      snap_slots.push_back(snap.slot);
    }
  }
  // Decoding sequences first (in the given order), then the others.
  auto decodes = [&](const SeqStep& st) { return st.ids.size() == 1 && get(st.seq).tokens > 0; };
  std::vector<size_t> order;
  for (size_t i = 0; i < steps.size(); ++i)
    if (decodes(steps[i])) order.push_back(i);
  const int64_t num_decode = static_cast<int64_t>(order.size());
  for (size_t i = 0; i < steps.size(); ++i)
    if (!decodes(steps[i])) order.push_back(i);

  Batch b;
  b.num_decode = num_decode;
  SeqLayout& L = b.layout;
  L.page_size = ps;
  L.max_pages = max_pages;
  L.cu_seqlens.push_back(0);
  std::vector<int32_t> first_row(steps.size());
  for (size_t i : order) {
    const SeqStep& st = steps[i];
    const Sequence& s = get(st.seq);
    // A page is written only by its one holder: shared pages are full (see adopt).
    KL_CHECK(sizes_.bytes_per_page == 0 || s.tokens % ps == 0 || page_refs_[s.pages[s.tokens / ps]] == 1,
             "sequence " + std::to_string(st.seq) + " would write a shared page");
    first_row[i] = static_cast<int32_t>(b.ids.size());
    b.seqs.push_back(st.seq);
    b.ids.insert(b.ids.end(), st.ids.begin(), st.ids.end());
    L.cu_seqlens.push_back(static_cast<int32_t>(b.ids.size()));
    L.cached.push_back(static_cast<int32_t>(s.tokens));
    L.slots.push_back(static_cast<int32_t>(s.slot));
    for (int64_t p = 0; p < max_pages; ++p)
      L.page_table.push_back(p < static_cast<int64_t>(s.pages.size()) ? s.pages[p] : -1);
    for (const Snapshot& snap : st.snapshots) {
      L.snap_seq.push_back(static_cast<int32_t>(b.seqs.size() - 1));
      L.snap_pos.push_back(static_cast<int32_t>(snap.after));
      L.snap_slot.push_back(static_cast<int32_t>(snap.slot));
    }
  }
  for (size_t i = 0; i < steps.size(); ++i) {
    const int32_t n = static_cast<int32_t>(steps[i].ids.size());
    for (int32_t r = steps[i].logits == LogitsMode::kAll ? 0 : n - 1; r < n; ++r) b.logit_rows.push_back(first_row[i] + r);
  }
  b.decode = L.part(0, num_decode);
  b.prefill = L.part(num_decode, L.num_seqs());
  return b;
}

int64_t Cache::max_pages_per_seq() const {
  if (sizes_.pages == 0) return 0;
  const int64_t context = config_.max_position_embeddings;
  return context > 0 ? std::min<int64_t>(sizes_.pages, (context + sizes_.page_size - 1) / sizes_.page_size) : sizes_.pages;
}

void Cache::pad(Batch& b, int64_t seqs, int64_t cols) const {
  SeqLayout& L = b.layout;
  const int64_t n = L.num_seqs();
  KL_CHECK(b.num_decode == n && L.snap_seq.empty() && seqs >= n && L.max_pages <= cols && cols <= max_pages_per_seq() &&
               static_cast<int64_t>(b.logit_rows.size()) == n,
           "pad: not a decode-only batch of at most " + std::to_string(seqs) + " sequences and " +
               std::to_string(cols) + " pages each");
  std::vector<int32_t> table(static_cast<size_t>(seqs * cols), -1);
  for (int64_t s = 0; s < n; ++s)
    std::copy_n(L.page_table.begin() + s * L.max_pages, L.max_pages, table.begin() + s * cols);
  for (int64_t s = n; s < seqs; ++s) {
    if (cols > 0) table[static_cast<size_t>(s * cols)] = static_cast<int32_t>(sizes_.pages);  // the scratch page
    b.ids.push_back(0);
    b.logit_rows.push_back(L.cu_seqlens.back());
    L.cu_seqlens.push_back(L.cu_seqlens.back() + 1);
    L.cached.push_back(0);
    L.slots.push_back(static_cast<int32_t>(scratch_slot()));
  }
  L.page_table = std::move(table);
  L.max_pages = cols;
  b.num_decode = seqs;
  b.decode = L.part(0, seqs);
  b.prefill = L.part(seqs, seqs);
}

void Cache::advance(const Batch& batch) {
  for (size_t b = 0; b < batch.seqs.size(); ++b) get(batch.seqs[b]).tokens += batch.layout.new_tokens(static_cast<int64_t>(b));
}

}  // namespace klinear
