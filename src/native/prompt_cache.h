// The prompt cache: what each sequence's memory holds between calls, so that a call decodes only the
// part of its prompt that an earlier call on that sequence has not (docs/adr/0018-prompt-cache.md).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "llama.h"

namespace llamaspec {

struct Core;

// The part of a sequence's state that llama_memory_seq_rm cannot cut back to an earlier position
// (the recurrent state of hybrid and recurrent models, on the target and on a recurrent draft
// model), and the drafter's own per-sequence state, as it was after positions [0, n_tokens).
struct Checkpoint {
    int32_t n_tokens = 0;
    llama_pos dft_n = 0;  // positions the drafter's context held then (EAGLE-3 keeps one deferred)
    std::vector<uint8_t> tgt, dft, spec;
    size_t bytes() const { return tgt.size() + dft.size() + spec.size(); }
};

// The sequences' caches of one engine. Ownership: the engine's (one per session); it reads and
// writes the Core's contexts, which outlive it. Threads: `choose` and `forget_all` run under the
// engine's mutex; the rest on the engine thread, on a sequence its call holds.
class PromptCache {
public:
    // `max_checkpoints`: checkpoints kept per sequence (recurrent models only; the oldest goes first).
    PromptCache(Core & core, int32_t n_seq, int32_t max_checkpoints);

    // Of the free sequences, the one whose cache shares the longest prefix with `prompt`; with no
    // prefix in common, the one used least recently (so that other conversations keep theirs).
    int32_t choose(const std::vector<bool> & free, const std::vector<llama_token> & prompt) const;
    // A call starts on `seq`: leaves in its memory the longest prefix of `prompt` it can reuse (all
    // of the prompt but its last token at most: that one is decoded) and returns its length; 0 with
    // `enabled` false or nothing in common (the memory is then empty). Raises DecodeError when the
    // memory cannot be emptied.
    int32_t reuse(llama_seq_id seq, const std::vector<llama_token> & prompt, bool enabled);
    // The prompt's positions [0, n_tokens) are decoded: keeps a checkpoint there (recurrent models).
    void checkpoint(llama_seq_id seq, int32_t n_tokens);
    // A call ends: its memory holds `tokens` at positions [0, size) (anything after them is trimmed).
    // When the trim fails, the sequence's memory is emptied instead.
    void keep(llama_seq_id seq, const std::vector<llama_token> & tokens);
    // The sequence's memory was emptied (or is unknown): forget what it held.
    void forget(llama_seq_id seq);
    // Someone else changed the memory (a direct call on the context): forget every sequence.
    void forget_all();
    // Bytes held by checkpoints (all sequences).
    size_t checkpoint_bytes() const;
    bool checkpoints_needed() const { return needs_checkpoints_; }

private:
    struct Seq {
        std::vector<llama_token> tokens;       // at positions [0, size) of the target's and drafter's memory
        std::vector<Checkpoint> checkpoints;  // ascending n_tokens
        uint64_t last_used = 0;
    };
    // seq_rm(seq, p0, -1) on both memories; false (and nothing removed from the target) when refused
    bool trim(llama_seq_id seq, llama_pos p0);
    void clear(llama_seq_id seq);  // empties both memories (raises DecodeError when refused)
    bool restore(llama_seq_id seq, const Checkpoint & ck);

    Core & core_;
    std::vector<Seq> seqs_;
    int32_t max_checkpoints_;
    bool needs_checkpoints_ = false;  // the target or the draft model is recurrent or hybrid
    bool dft_recurrent_ = false;
    uint64_t clock_ = 0;
};

}  // namespace llamaspec
