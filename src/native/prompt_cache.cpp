// The prompt cache (see prompt_cache.h and docs/adr/0018-prompt-cache.md).
#include "prompt_cache.h"

#include <algorithm>

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
}  // namespace

PromptCache::PromptCache(Core & core, int32_t n_seq, int32_t max_checkpoints)
    : core_(core), seqs_((size_t) n_seq), max_checkpoints_(std::max(0, max_checkpoints)) {
    tgt_recurrent_ = is_recurrent(core.tgt->model()->get());
    dft_recurrent_ = core.dft && is_recurrent(core.dft->model()->get());
    eagle3_ = has_stage(core, COMMON_SPECULATIVE_TYPE_DRAFT_EAGLE3);
    drafter_state_ = eagle3_ || has_stage(core, COMMON_SPECULATIVE_TYPE_DRAFT_MTP);
}

int32_t PromptCache::choose(const std::vector<bool> & free, const std::vector<llama_token> & prompt) const {
    std::lock_guard<std::mutex> lock(mutex_);
    int32_t best = -1;
    size_t best_len = 0;
    for (size_t i = 0; i < seqs_.size() && i < free.size(); ++i) {
        if (!free[i]) continue;
        const size_t len = common_prefix(seqs_[i].tokens, prompt);
        const bool better = best < 0 || len > best_len ||
                            (len == best_len && best_len == 0 && seqs_[i].last_used < seqs_[(size_t) best].last_used);
        if (better) {
            best = (int32_t) i;
            best_len = len;
        }
    }
    return best;
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
    seqs_[(size_t) seq].tokens.clear();
    seqs_[(size_t) seq].checkpoints.clear();
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

int32_t PromptCache::reuse(llama_seq_id seq, const std::vector<llama_token> & prompt, bool enabled) {
    std::lock_guard<std::mutex> lock(mutex_);
    Seq & s = seqs_[(size_t) seq];
    s.last_used = ++clock_;
    const int32_t limit = (int32_t) prompt.size() - 1;  // the last prompt token is always decoded
    int32_t n_keep = enabled ? (int32_t) std::min(common_prefix(s.tokens, prompt), (size_t) std::max(0, limit)) : 0;
    // a cut inside what the sequence holds: where the drafter's row was saved, else anywhere the
    // memory allows (with an attention-only target the drafter's first step may read an older row)
    const bool inside = n_keep < (int32_t) s.tokens.size();
    bool kept = n_keep > 0 && !(inside && drafter_state_) && trim(seq, n_keep);
    if (!kept && n_keep > 0) {
        // the latest checkpoint at or before the cut (one try: a failed restore leaves the memory
        // half-changed, so the sequence is cleared below)
        auto it = std::find_if(s.checkpoints.rbegin(), s.checkpoints.rend(),
                               [n_keep](const Checkpoint & c) { return c.n_tokens <= n_keep; });
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

void PromptCache::checkpoint(llama_seq_id seq, int32_t n_tokens) {
    if (!(recurrent() || drafter_state_) || max_checkpoints_ == 0 || n_tokens <= 0) return;
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
    seqs_[(size_t) seq].tokens.clear();
    seqs_[(size_t) seq].checkpoints.clear();
}

void PromptCache::forget_all() {
    std::lock_guard<std::mutex> lock(mutex_);
    for (auto & s : seqs_) {
        s.tokens.clear();
        s.checkpoints.clear();
    }
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
