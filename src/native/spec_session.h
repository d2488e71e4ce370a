// Speculative generation driven by upstream common_speculative: every drafter it implements (MTP,
// a separate draft model, EAGLE-3, DFlash, DSpark, the n-gram family) and chains of them, behind one
// session type.
#pragma once

#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include <nanobind/nanobind.h>

#include "speculative.h"  // common
#include "adaptive.h"
#include "generator.h"

namespace llamaspec {

// What the Python face has validated and normalised: upstream method names, limits, n-gram tuning.
struct SpecConfig {
    std::vector<std::string> methods;  // upstream names ("draft-mtp", "ngram-mod", ...), no duplicates
    int32_t n_draft = 3;               // the cap on every stage's draft, and the rollback depth
    bool adaptive = false;             // choose the length per verify (n_draft is then the maximum)
    int32_t n_draft_min = 0;           // drafts shorter than this are dropped (draft models, ngram-mod)
    float p_min = 0.0f;                // draft models stop at a token below this probability
    int32_t ngram_size_n = 12;         // key length of ngram-simple / ngram-map-k / ngram-map-k4v
    int32_t ngram_min_hits = 1;        // ngram-map-k / -k4v: hits before a continuation is proposed
    int32_t ngram_mod_n_match = 24;    // ngram-mod: tokens that must match
    std::string ngram_cache_static;    // ngram-cache: optional cache files (common_ngram_cache_save format)
    std::string ngram_cache_dynamic;
};

// Counters of one stage (one upstream implementation) of a chain.
struct StageCounters {
    uint64_t drafts = 0;             // drafts it produced (iterations where it was the one that drafted)
    uint64_t drafts_generated = 0;   // draft tokens it proposed
    uint64_t drafts_accepted = 0;    // of those, accepted by the target
    double draft_us = 0;             // time inside its draft() calls, also the ones that found nothing
    std::vector<uint64_t> drafted_per_position;
    std::vector<uint64_t> accepted_per_position;

    explicit StageCounters(size_t n_draft = 0) : drafted_per_position(n_draft, 0), accepted_per_position(n_draft, 0) {}
    void add(const StageCounters & o);
};

// Counters of speculative generation. Used both as running totals and as the deltas a worker
// accumulates between two publications.
struct SpecCounters {
    uint64_t iterations = 0;        // verify passes (the prompt pass is not one)
    uint64_t drafts_generated = 0;  // draft tokens proposed
    uint64_t drafts_accepted = 0;   // draft tokens the target accepted
    uint64_t tokens_emitted = 0;    // Token events
    uint64_t shadow_drafts = 0;     // n_draft="auto": unverified one-token looks during plain steps
    uint64_t shadow_accepted = 0;   // ... whose token equalled the one the plain step sampled
    uint64_t rate_tokens = 0;       // sum over calls of (tokens - 1): the numerator of tokens/s
    double window_s = 0;            // sum over calls of first-to-last-token time
    double draft_us = 0, verify_us = 0, sample_us = 0, prefill_us = 0, total_us = 0;
    std::vector<uint64_t> drafted_per_position;   // [n_draft]
    std::vector<uint64_t> accepted_per_position;  // [n_draft]
    std::vector<StageCounters> stages;            // [number of stages], in the order they are tried
    std::vector<uint64_t> draft_length_histogram; // [n_draft + 1]: verifies by the draft length asked for

    SpecCounters(size_t n_draft = 0, size_t n_stages = 0)
        : drafted_per_position(n_draft, 0), accepted_per_position(n_draft, 0), stages(n_stages, StageCounters(n_draft)),
          draft_length_histogram(n_draft + 1, 0) {}
    void add(const SpecCounters & o);
    void clear();
};

// The session's cumulative statistics, readable from any thread at any time. The worker folds its
// deltas in with try_lock (it never waits for a reader); a reader copies under the lock, so every
// snapshot is a consistent set of counters.
class SpecStatsBox {
public:
    SpecStatsBox(size_t n_draft, size_t n_stages) : totals_(n_draft, n_stages) {}
    bool try_fold(SpecCounters & delta);  // worker, per iteration: folds and clears delta if free
    void fold(SpecCounters & delta);      // worker, at the end of a call
    SpecCounters snapshot() const;
    void reset();

private:
    mutable std::mutex mutex_;
    SpecCounters totals_;
};

// What a SpecRun needs, shared with the session (shared_ptr): contexts, the common_speculative state,
// the stats. Ownership: the draft context (absent for n-gram-only chains) holds the target context
// (Context::other_) and its own model, so the target outlives it; `spec` refers to both and is
// declared last, so it is freed first.
struct SpecCore {
    std::shared_ptr<Context> tgt;
    std::shared_ptr<Context> dft;   // null when no stage drafts with a model
    SpecConfig config;
    std::vector<common_speculative_type> stage_types;  // in the order upstream tries them
    std::unique_ptr<SpecStatsBox> stats;
    std::unique_ptr<DraftLengthPolicy> policy;  // n_draft="auto"; what it learned carries over between calls
    common_speculative_ptr spec;
};

// The engine behind llamaspec.Speculative (and MTP): one generation at a time, reusable across calls.
class SpecSession {
public:
    // Checks the configuration against the models (every check that upstream would answer with an
    // abort is made here first and raised as a typed Error), then builds the target context
    // (n_rs_seq = n_draft: rollback of rejected drafts on recurrent/hybrid models; 1 + n_draft
    // outputs), the draft context when a stage needs one (MTP: the target model with ctx_type MTP;
    // otherwise `draft_model`; both built against the target) and the speculative state, in the order
    // that works (init before the first target decode). Call without the GIL.
    static std::shared_ptr<SpecSession> create(std::shared_ptr<Model> model, llama_context_params params,
                                               SpecConfig config, std::shared_ptr<Model> draft_model);

    std::shared_ptr<Run> start(GenRequest req);
    const std::shared_ptr<SpecCore> & core() const { return core_; }
    bool busy() const { return busy_->load(); }

private:
    std::shared_ptr<SpecCore> core_;
    std::shared_ptr<std::atomic<bool>> busy_ = std::make_shared<std::atomic<bool>>(false);
};

class SpecRun final : public Run {
public:
    SpecRun(std::shared_ptr<SpecCore> core, std::shared_ptr<std::atomic<bool>> busy, GenRequest req,
            common_sampler_ptr smpl);
    ~SpecRun() override { close(); }  // join before this object's parts go (see ~Run)
    void cancel() override;

protected:
    void work() override;

private:
    std::shared_ptr<SpecCore> core_;
};

// Writes an n-gram cache file for the ngram-cache method (llama-lookup-create's format) from tokens.
// Throws Error(Generic) when the file cannot be written.
void ngram_cache_create(const std::vector<llama_token> & tokens, const std::string & path);

void register_speculative(nanobind::module_ & m);

}  // namespace llamaspec
