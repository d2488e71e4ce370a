// The prompt cache: what each sequence's memory holds between calls, so that a call decodes only the
// part of its prompt that an earlier call on that sequence has not (docs/adr/0018-prompt-cache.md).
#pragma once

#include <cstddef>
#include <cstdint>
#include <list>
#include <mutex>
#include <vector>

#include "llama.h"

namespace llamaspec {

struct Core;

// What llama_memory_seq_rm cannot bring back to an earlier position, as it was after positions
// [0, n_tokens): the recurrent state of hybrid and recurrent models (target, recurrent draft model)
// and the drafter's own per-sequence state (the hidden row MTP and EAGLE-3 carry into their next
// step, common_speculative_get_state; patch 0008 for MTP).
struct Checkpoint {
    int32_t n_tokens = 0;
    llama_pos dft_n = 0;  // positions the drafter's context held then (EAGLE-3 defers its last one)
    std::vector<uint8_t> tgt, dft, spec;
    size_t bytes() const { return tgt.size() + dft.size() + spec.size(); }
};

// What one sequence's cache holds, for readers (Session.prompt_cache()).
struct SeqCacheInfo {
    int32_t tokens = 0;
    int32_t checkpoints = 0;
    size_t checkpoint_bytes = 0;
};

// What the host-memory cache holds, for readers (Session.prompt_cache_ram()).
struct RamCacheInfo {
    int32_t prompts = 0;
    int64_t tokens = 0;
    size_t bytes = 0;
    size_t limit_bytes = 0;  // 0: off; SIZE_MAX: no limit
};

// The sequences' caches of one engine. Ownership: the engine's (one per session); it reads and
// writes the Core's contexts, which outlive it. Threads: `choose` and `forget_all` run under the
// engine's mutex, the others on the engine thread on a sequence its call holds; `info` from any
// thread (the records are guarded by their own mutex).
class PromptCache {
public:
    // Sized by the core's config: n_seq sequences, ctx_checkpoints checkpoints kept per sequence
    // (the oldest goes first), checkpoint_every, prompt_cache_mb.
    explicit PromptCache(Core & core);

    // Of the free sequences, the one whose cache shares the longest prefix with `prompt`; when that
    // is a tenth of the prompt or less, the one used least recently (so that other conversations
    // keep theirs).
    int32_t choose(const std::vector<bool> & free, const std::vector<llama_token> & prompt) const;
    // A call starts on `seq`: leaves in its memory the longest prefix of `prompt` it can reuse (all
    // of the prompt but its last token at most: that one is decoded) and returns its length; 0 with
    // `enabled` false or nothing in common (the memory is then empty). Raises DecodeError when the
    // memory cannot be emptied.
    int32_t reuse(llama_seq_id seq, const std::vector<llama_token> & prompt, bool enabled);
    // The prompt's positions [0, n_tokens) are decoded: keeps a checkpoint there (recurrent models,
    // drafters with a hidden row). `periodic`: only when the sequence's last checkpoint is
    // checkpoint_every tokens back or more (inside a long prompt).
    void checkpoint(llama_seq_id seq, int32_t n_tokens, bool periodic = false);
    // A call ends: its memory holds `tokens` at positions [0, size) (anything after them is trimmed).
    // When the trim fails, the sequence's memory is emptied instead.
    void keep(llama_seq_id seq, const std::vector<llama_token> & tokens);
    // The sequence's memory was emptied (or is unknown): forget what it held.
    void forget(llama_seq_id seq);
    // Someone else changed the memory (a direct call on the context): forget every sequence.
    void forget_all();
    // Forgets the sequence and empties its memory (both contexts); false when llama.cpp refused.
    bool clear(llama_seq_id seq);
    std::vector<SeqCacheInfo> info() const;
    RamCacheInfo ram_info() const;
    // The memory holds a recurrent state (target or draft model): a half-written step cannot be
    // trimmed away.
    bool recurrent() const { return tgt_recurrent_ || dft_recurrent_; }
    // The memory cannot be cut back to any position: a recurrent state, or a drafter's carried row
    // (MTP's pending hidden state, EAGLE-3's deferred row). Such sequences keep checkpoints.
    bool checkpointed() const { return recurrent() || drafter_state_; }

private:
    struct Seq {
        std::vector<llama_token> tokens;       // at positions [0, size) of the target's and drafter's memory
        std::vector<Checkpoint> checkpoints;  // ascending n_tokens
        uint64_t last_used = 0;
        void forget() {  // the memory holds nothing known
            tokens.clear();
            checkpoints.clear();
        }
    };
    // A sequence's memory saved in host RAM (prompt_cache_mb): its record, and its state in both
    // contexts and the drafter's as llama.cpp's per-sequence state API writes them.
    struct Saved {
        Seq record;
        std::vector<uint8_t> tgt, dft, spec;
        size_t bytes() const;
    };
    // seq_rm(seq, p0, -1) on both memories; false (and nothing removed from the target) when refused
    bool trim(llama_seq_id seq, llama_pos p0);
    bool clear_locked(llama_seq_id seq);  // clear() with mutex_ held
    bool restore(llama_seq_id seq, const Checkpoint & ck);
    // Tokens of `prompt` a call would keep from `r` (without touching the memory); what reuse does
    // when every cut it tries succeeds.
    int32_t reusable(const Seq & r, const std::vector<llama_token> & prompt) const;
    // The host-memory cache at a call's start (mutex_ held): saves what the sequence holds when
    // the call would lose most of it, and loads a saved prompt that serves the call better.
    void swap(llama_seq_id seq, const std::vector<llama_token> & prompt, bool enabled);
    void save(llama_seq_id seq);              // what the sequence holds, into saved_
    void load(llama_seq_id seq, Saved e);     // into the sequence (emptied first; empty on failure)

    Core & core_;
    mutable std::mutex mutex_;  // guards seqs_ and saved_ (the engine thread writes, readers copy)
    std::vector<Seq> seqs_;
    std::list<Saved> saved_;  // least recently saved first
    size_t saved_bytes_ = 0;
    size_t ram_limit_ = 0;    // bytes (prompt_cache_mb); 0: off
    int32_t max_checkpoints_;
    int32_t checkpoint_every_;
    bool tgt_recurrent_ = false, dft_recurrent_ = false;
    // the drafter carries a hidden row into its next step (MTP, EAGLE-3): a cut inside what a
    // sequence holds goes back to a checkpoint, where that row was saved, when there is one
    bool drafter_state_ = false;
    bool eagle3_ = false;  // its context row P reads token P + 1 (checkpoints trim it to dft_n)
    uint64_t clock_ = 0;
};

}  // namespace llamaspec
