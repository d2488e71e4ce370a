// The prompt cache (see prompt_cache.h and docs/adr/0018-prompt-cache.md).
#include "prompt_cache.h"

#include <algorithm>
#include <limits>
#include <new>
#include <optional>

#include "engine.h"

namespace llamaspec {

namespace {
bool is_recurrent(const llama_model * m) { return llama_model_is_recurrent(m) || llama_model_is_hybrid(m); }

size_t common_prefix(const std::vector<llama_token> & a, const std::vector<llama_token> & b) {
    const size_t n = std::min(a.size(), b.size());
    size_t i = 0;
    while (i < n && a[i] == b[i]) ++i;
    return i;
}

// the part of a sequence's state that cannot be cut back (PARTIAL_ONLY: the recurrent state)
std::vector<uint8_t> save_partial(llama_context * ctx, llama_seq_id seq) {
    std::vector<uint8_t> data(llama_state_seq_get_size_ext(ctx, seq, LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY));
    const size_t n = llama_state_seq_get_data_ext(ctx, data.data(), data.size(), seq, LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY);
    data.resize(n);
    return data;
}

bool load_partial(llama_context * ctx, llama_seq_id seq, const std::vector<uint8_t> & data) {
    return !data.empty() && llama_state_seq_set_data_ext(ctx, data.data(), data.size(), seq,
                                                         LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY) == data.size();
}

bool has_stage(const Core & core, common_speculative_type t) {
    return std::find(core.stage_types.begin(), core.stage_types.end(), t) != core.stage_types.end();
}

// the whole of a sequence's state (both parts of a hybrid memory); empty when refused
std::vector<uint8_t> save_full(llama_context * ctx, llama_seq_id seq) {
    std::vector<uint8_t> data(llama_state_seq_get_size_ext(ctx, seq, 0));
    if (llama_state_seq_get_data_ext(ctx, data.data(), data.size(), seq, 0) != data.size()) data.clear();
    return data;
}

bool load_full(llama_context * ctx, llama_seq_id seq, const std::vector<uint8_t> & data) {
    return llama_state_seq_set_data_ext(ctx, data.data(), data.size(), seq, 0) == data.size();
}

// the prefix of `prompt` that `tokens` hold, as far as a call may keep it: all of the prompt but its
// last token at most (that token is decoded: the first token is sampled from its row)
int32_t keepable(const std::vector<llama_token> & tokens, const std::vector<llama_token> & prompt) {
    return (int32_t) std::min(common_prefix(tokens, prompt), prompt.empty() ? 0 : prompt.size() - 1);
}

// the latest checkpoint at or before position n, or end
std::vector<Checkpoint>::const_reverse_iterator latest(const std::vector<Checkpoint> & cks, int32_t n) {
    return std::find_if(cks.rbegin(), cks.rend(), [n](const Checkpoint & c) { return c.n_tokens <= n; });
}

size_t ram_limit(int64_t mb) {
    if (mb < 0) return std::numeric_limits<size_t>::max();
    return (size_t) mb * 1024 * 1024;
}
}  // namespace

size_t PromptCache::Saved::bytes() const {
    size_t n = tgt.size() + dft.size() + spec.size() + record.tokens.size() * sizeof(llama_token);
    for (const auto & c : record.checkpoints) n += c.bytes();
    return n;
}

PromptCache::PromptCache(Core & core)
    : core_(core), seqs_((size_t) core.config.n_seq), ram_limit_(ram_limit(core.config.prompt_cache_mb)),
      max_checkpoints_(std::max(0, core.config.ctx_checkpoints)),
      checkpoint_every_(std::max(0, core.config.checkpoint_every)) {
    const bool mtp = has_stage(core, COMMON_SPECULATIVE_TYPE_DRAFT_MTP);
    tgt_recurrent_ = is_recurrent(core.tgt->model()->get());
    // the MTP head's context of a hybrid model keeps a plain attention cache (llama-model.cpp,
    // mtp_on_hybrid_*): its rows are cut like any other, and a PARTIAL_ONLY state of it would be all
    // of them (a wrong guess is safe: a refused cut clears the sequence)
    dft_recurrent_ = core.dft && (mtp ? llama_model_is_recurrent(core.dft->model()->get())
                                      : is_recurrent(core.dft->model()->get()));
    eagle3_ = has_stage(core, COMMON_SPECULATIVE_TYPE_DRAFT_EAGLE3);
    drafter_state_ = eagle3_ || mtp;
}

int32_t PromptCache::choose(const std::vector<bool> & free, const std::vector<llama_token> & prompt) const {
    std::lock_guard<std::mutex> lock(mutex_);
    int32_t best = -1, lru = -1;
    size_t best_len = 0;
    for (size_t i = 0; i < seqs_.size() && i < free.size(); ++i) {
        if (!free[i]) continue;
        const size_t len = common_prefix(seqs_[i].tokens, prompt);
        if (best < 0 || len > best_len) {
            best = (int32_t) i;
            best_len = len;
        }
        if (lru < 0 || seqs_[i].last_used < seqs_[(size_t) lru].last_used) lru = (int32_t) i;
    }
    // a prefix of a tenth of the prompt or less (a chat template's opening): not worth another
    // conversation's sequence (llama-server's --slot-prompt-similarity 0.1)
    return 10 * best_len > prompt.size() ? best : lru;
}

bool PromptCache::trim(llama_seq_id seq, llama_pos p0) {
    // hybrid memories try their recurrent part first and change nothing when it refuses
    if (!llama_memory_seq_rm(llama_get_memory(core_.tgt->get()), seq, p0, -1)) return false;
    if (core_.dft && !llama_memory_seq_rm(llama_get_memory(core_.dft->get()), seq, p0, -1)) {
        clear_locked(seq);  // the target is trimmed already: start this sequence afresh
        return false;
    }
    return true;
}

bool PromptCache::clear(llama_seq_id seq) {
    std::lock_guard<std::mutex> lock(mutex_);
    return clear_locked(seq);
}

bool PromptCache::clear_locked(llama_seq_id seq) {
    seqs_[(size_t) seq].forget();
    const bool tgt = llama_memory_seq_rm(llama_get_memory(core_.tgt->get()), seq, -1, -1);
    return (!core_.dft || llama_memory_seq_rm(llama_get_memory(core_.dft->get()), seq, -1, -1)) && tgt;
}

bool PromptCache::restore(llama_seq_id seq, const Checkpoint & ck) {
    if (tgt_recurrent_ && !load_partial(core_.tgt->get(), seq, ck.tgt)) return false;
    if (dft_recurrent_ && !load_partial(core_.dft->get(), seq, ck.dft)) return false;
    // the recurrent state is at n_tokens now: this drops the attention rows after it
    if (!trim(seq, ck.n_tokens)) return false;
    if (!ck.spec.empty()) {
        common_speculative_set_state(core_.spec.get(), seq, ck.spec);
        // EAGLE-3's stashed row is the one it had not written yet: its context goes back to then
        if (eagle3_ && ck.dft_n < ck.n_tokens &&
            !llama_memory_seq_rm(llama_get_memory(core_.dft->get()), seq, ck.dft_n, -1)) {
            return false;
        }
    }
    return true;
}

int32_t PromptCache::reusable(const Seq & r, const std::vector<llama_token> & prompt) const {
    const int32_t n = keepable(r.tokens, prompt);
    if (n == (int32_t) r.tokens.size() || !checkpointed()) return n;  // a cut
    auto it = latest(r.checkpoints, n);
    if (it != r.checkpoints.rend()) return it->n_tokens;
    return recurrent() ? 0 : n;  // an attention-only target with a drafter cuts anyway
}

void PromptCache::swap(llama_seq_id seq, const std::vector<llama_token> & prompt, bool enabled) {
    Seq & s = seqs_[(size_t) seq];
    const int32_t here = enabled ? reusable(s, prompt) : 0;
    // a saved prompt that this call would reuse more of, without losing most of it (a large saved
    // prompt is not spent on a short match: loading takes it out of the cache)
    auto best = saved_.end();
    int32_t best_n = here;
    for (auto it = enabled ? saved_.begin() : saved_.end(); it != saved_.end(); ++it) {
        const int32_t n = reusable(it->record, prompt);
        if (n > best_n && 4 * (size_t) n >= it->record.tokens.size()) {
            best = it;
            best_n = n;
        }
    }
    std::optional<Saved> take;
    if (best != saved_.end()) {
        saved_bytes_ -= best->bytes();
        take = std::move(*best);
        saved_.erase(best);
    }
    // what the sequence holds is replaced, or the call would lose most of it (llama-server's rule)
    if (take || 2 * (size_t) here < s.tokens.size()) save(seq);
    if (take) load(seq, std::move(*take));
}

void PromptCache::save(llama_seq_id seq) {
    const Seq & s = seqs_[(size_t) seq];
    if (s.tokens.empty()) return;
    for (const Saved & e : saved_) {
        // held already (a longer saved prompt serves this one where its memory can be cut back)
        const bool held = common_prefix(e.record.tokens, s.tokens) == s.tokens.size();
        if (held && (e.record.tokens.size() == s.tokens.size() || !recurrent())) return;
    }
    // the drafter's deferred rows (MTP's catch-up, patch 0005) into its context, which is saved whole
    if (core_.spec && !common_speculative_flush(core_.spec.get())) return;
    Saved e;
    try {
        e.record.tokens = s.tokens;
        e.record.checkpoints = s.checkpoints;
        e.tgt = save_full(core_.tgt->get(), seq);
        if (core_.dft) e.dft = save_full(core_.dft->get(), seq);
        if (core_.spec) common_speculative_get_state(core_.spec.get(), seq, e.spec);
    } catch (const std::bad_alloc &) {
        return;  // no room in host memory: the sequence is not saved
    }
    if (e.tgt.empty() || (core_.dft && e.dft.empty()) || e.bytes() > ram_limit_) return;
    // saved prompts that this one extends serve nothing it does not; then the oldest make room
    for (auto it = saved_.begin(); it != saved_.end();) {
        if (common_prefix(it->record.tokens, s.tokens) == it->record.tokens.size()) {
            saved_bytes_ -= it->bytes();
            it = saved_.erase(it);
        } else {
            ++it;
        }
    }
    while (!saved_.empty() && saved_bytes_ + e.bytes() > ram_limit_) {
        saved_bytes_ -= saved_.front().bytes();
        saved_.pop_front();
    }
    saved_bytes_ += e.bytes();
    e.record.last_used = s.last_used;
    saved_.push_back(std::move(e));
}

void PromptCache::load(llama_seq_id seq, Saved e) {
    Seq & s = seqs_[(size_t) seq];
    const uint64_t used = s.last_used;
    // rows the drafter deferred for the sequence's old content go there before it is emptied, not
    // into the loaded state (patch 0009; a failed flush drops them)
    if (core_.spec) common_speculative_flush(core_.spec.get());
    if (!clear_locked(seq)) return;  // reuse clears again, and raises
    if (!load_full(core_.tgt->get(), seq, e.tgt) || (core_.dft && !load_full(core_.dft->get(), seq, e.dft))) {
        clear_locked(seq);  // the call starts afresh
        return;
    }
    if (core_.spec && !e.spec.empty()) common_speculative_set_state(core_.spec.get(), seq, e.spec);
    s = std::move(e.record);
    s.last_used = used;
}

int32_t PromptCache::reuse(llama_seq_id seq, const std::vector<llama_token> & prompt, bool enabled) {
    std::lock_guard<std::mutex> lock(mutex_);
    Seq & s = seqs_[(size_t) seq];
    s.last_used = ++clock_;
    if (ram_limit_ > 0) swap(seq, prompt, enabled);
    int32_t n_keep = enabled ? keepable(s.tokens, prompt) : 0;
    // a cut inside what the sequence holds: where the drafter's row was saved, else anywhere the
    // memory allows (with an attention-only target the drafter's first step may read an older row)
    const bool inside = n_keep < (int32_t) s.tokens.size();
    bool kept = n_keep > 0 && !(inside && drafter_state_) && trim(seq, n_keep);
    if (!kept && n_keep > 0) {
        // the latest checkpoint at or before the cut (one try: a failed restore leaves the memory
        // half-changed, so the sequence is cleared below)
        auto it = latest(s.checkpoints, n_keep);
        if (it != s.checkpoints.rend()) {
            kept = restore(seq, *it);
            n_keep = it->n_tokens;
        } else if (inside && drafter_state_ && !recurrent()) {
            kept = trim(seq, n_keep);
        }
    }
    if (!kept) {
        if (!clear_locked(seq)) throw Error(ErrorKind::Decode, "could not empty sequence " + std::to_string(seq) + "'s cache");
        return 0;
    }
    s.tokens.resize((size_t) n_keep);  // until the call's end: what the memory is known to hold
    s.checkpoints.erase(std::remove_if(s.checkpoints.begin(), s.checkpoints.end(),
                                       [n_keep](const Checkpoint & c) { return c.n_tokens > n_keep; }),
                        s.checkpoints.end());
    return n_keep;
}

void PromptCache::checkpoint(llama_seq_id seq, int32_t n_tokens, bool periodic) {
    if (!checkpointed() || max_checkpoints_ == 0 || n_tokens <= 0) return;
    if (periodic) {
        std::lock_guard<std::mutex> lock(mutex_);
        const auto & cks = seqs_[(size_t) seq].checkpoints;
        if (checkpoint_every_ == 0 || n_tokens - (cks.empty() ? 0 : cks.back().n_tokens) < checkpoint_every_) return;
    }
    Checkpoint ck;
    ck.n_tokens = n_tokens;
    if (core_.dft) ck.dft_n = llama_memory_seq_pos_max(llama_get_memory(core_.dft->get()), seq) + 1;
    if (tgt_recurrent_) ck.tgt = save_partial(core_.tgt->get(), seq);
    if (dft_recurrent_) ck.dft = save_partial(core_.dft->get(), seq);
    if (core_.spec) common_speculative_get_state(core_.spec.get(), seq, ck.spec);
    if ((tgt_recurrent_ && ck.tgt.empty()) || (dft_recurrent_ && ck.dft.empty())) return;  // refused
    std::lock_guard<std::mutex> lock(mutex_);
    Seq & s = seqs_[(size_t) seq];
    if (!s.checkpoints.empty() && s.checkpoints.back().n_tokens >= n_tokens) return;  // have it
    if ((int32_t) s.checkpoints.size() >= max_checkpoints_) s.checkpoints.erase(s.checkpoints.begin());
    s.checkpoints.push_back(std::move(ck));
}

void PromptCache::keep(llama_seq_id seq, const std::vector<llama_token> & tokens) {
    std::lock_guard<std::mutex> lock(mutex_);
    Seq & s = seqs_[(size_t) seq];
    if (!trim(seq, (llama_pos) tokens.size())) {
        clear_locked(seq);  // a failure here is the next call's: its reuse clears again, and raises
        return;
    }
    s.tokens = tokens;
    s.last_used = ++clock_;
}

void PromptCache::forget(llama_seq_id seq) {
    std::lock_guard<std::mutex> lock(mutex_);
    seqs_[(size_t) seq].forget();
}

void PromptCache::forget_all() {
    std::lock_guard<std::mutex> lock(mutex_);
    for (auto & s : seqs_) s.forget();
}

RamCacheInfo PromptCache::ram_info() const {
    std::lock_guard<std::mutex> lock(mutex_);
    RamCacheInfo i;
    i.prompts = (int32_t) saved_.size();
    for (const Saved & e : saved_) i.tokens += (int64_t) e.record.tokens.size();
    i.bytes = saved_bytes_;
    i.limit_bytes = ram_limit_;
    return i;
}

std::vector<SeqCacheInfo> PromptCache::info() const {
    std::lock_guard<std::mutex> lock(mutex_);
    std::vector<SeqCacheInfo> out;
    for (const auto & s : seqs_) {
        SeqCacheInfo i;
        i.tokens = (int32_t) s.tokens.size();
        i.checkpoints = (int32_t) s.checkpoints.size();
        for (const auto & c : s.checkpoints) i.checkpoint_bytes += c.bytes();
        out.push_back(i);
    }
    return out;
}

}  // namespace llamaspec
