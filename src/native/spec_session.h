// Speculative generation driven by upstream common_speculative: every drafter it implements (MTP,
// a separate draft model, EAGLE-3, DFlash, DSpark, the n-gram family) and chains of them, behind one
// session type.
#pragma once

#include <condition_variable>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
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
    int32_t n_seq = 1;                 // sequences decoded together (each call takes one)
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
    uint64_t iterations = 0;        // verifies of a sequence (the prompt pass is not one)
    uint64_t passes = 0;            // target verify passes: one serves every sequence decoding (engine-level)
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
    void add(const SpecCounters & o) {
        add_counts(o);
        add_timing(o);
    }
    // the counts (everything but the times); totals of several sequences sum their counts...
    void add_counts(const SpecCounters & o);
    // ...but take their times from the engine: sequences share draft and verify passes
    // (draft/verify/sample/prefill/total microseconds, window_s, the stages' draft time)
    void add_timing(const SpecCounters & o);
    void clear();
};

// The session's cumulative statistics, in total and per sequence, readable from any thread at any
// time. The engine folds its deltas in with try_lock (it never waits for a reader); a reader copies
// under the lock, so every snapshot is a consistent set of counters.
class SpecStatsBox {
public:
    SpecStatsBox(size_t n_draft, size_t n_stages, size_t n_seq)
        : totals_(n_draft, n_stages), per_seq_(n_seq, SpecCounters(n_draft, n_stages)) {}
    // Folds a sequence's delta (into its counters and the totals' counts) and the engine's delta
    // (into the totals' times), clearing both; with wait=false only if the lock is free.
    bool fold(int32_t seq, SpecCounters & seq_delta, SpecCounters & engine_delta, bool wait);
    // The totals (seq < 0) or one sequence's counters.
    SpecCounters snapshot(int32_t seq = -1) const;
    void reset();

private:
    mutable std::mutex mutex_;
    SpecCounters totals_;
    std::vector<SpecCounters> per_seq_;
};

// What the engine needs, shared with the session (shared_ptr): contexts, the common_speculative
// state, the stats. Ownership: the draft context (absent for n-gram-only chains) holds the target context
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

class SpecEngine;

// The engine behind llamaspec.Speculative (and MTP): up to n_seq generations at a time, one per
// sequence, reusable across calls.
class SpecSession {
public:
    // Checks the configuration against the models (every check that upstream would answer with an
    // abort is made here first and raised as a typed Error), then builds the target context
    // (n_seq sequences of n_ctx tokens each; n_rs_seq = n_draft: rollback of rejected drafts on
    // recurrent/hybrid models; 1 + n_draft outputs per sequence), the draft context when a stage
    // needs one (MTP: the target model with ctx_type MTP; otherwise `draft_model`; both built
    // against the target) and the speculative state, in the order that works (init before the first
    // target decode). Call without the GIL.
    static std::shared_ptr<SpecSession> create(std::shared_ptr<Model> model, llama_context_params params,
                                               SpecConfig config, std::shared_ptr<Model> draft_model);

    // Starts a generation on a free sequence. Throws Busy (every sequence taken), ContextOverflow,
    // InvalidOption, Grammar. Call without the GIL.
    std::shared_ptr<Run> start(GenRequest req);
    const std::shared_ptr<SpecCore> & core() const { return core_; }
    bool busy() const;         // every sequence is taken
    int32_t n_running() const; // sequences taken

private:
    std::shared_ptr<SpecCore> core_;
    std::shared_ptr<SpecEngine> engine_;
};

// One generation call of a SpecSession, on its own sequence: the handle Python holds (Run's
// interface: events, cancel, close). The session's engine thread does the work. Ownership: it holds
// the engine (so contexts and speculative state outlive it); the engine holds only a pointer to it
// between admit and release, and close() waits for that release.
class SeqRun final : public Run {
public:
    SeqRun(std::shared_ptr<SpecEngine> engine, llama_seq_id seq, std::shared_ptr<std::atomic<bool>> slot,
           GenRequest req, common_sampler_ptr smpl);
    ~SeqRun() override { close(); }
    void launch() override;  // hands the sequence to the engine
    // Stops this sequence at the next iteration; a decode in flight is interrupted only when it
    // serves no other sequence (this one's prompt, or every sequence cancelled).
    void cancel() override;
    int32_t seq() const override { return seq_; }

protected:
    void work() override {}     // the engine does the work
    void join_worker() override;  // waits until the engine has released this sequence

private:
    friend class SpecEngine;
    std::shared_ptr<SpecEngine> engine_;
    llama_seq_id seq_;
    bool released_ = true;  // guarded by the engine's mutex: not (or no longer) in the engine's hands
};

// The decode loop of a SpecSession: one thread, started when a sequence arrives and gone when none
// is left, serves every active sequence. Each iteration prefills one n_batch chunk of every new
// sequence's prompt (alone: a cancel can interrupt it without touching the others), then drafts for
// all sequences that are decoding in one common_speculative_draft call (MTP and draft models batch
// the sequences), verifies them all in one target pass, and samples, accepts and emits per
// sequence. Stats: per sequence (the passes it took part in) and in total (each pass once).
class SpecEngine {
public:
    explicit SpecEngine(std::shared_ptr<SpecCore> core);
    ~SpecEngine();
    SpecEngine(const SpecEngine &) = delete;
    SpecEngine & operator=(const SpecEngine &) = delete;

    // See SpecSession::start. `self` is this engine's owning pointer (the run keeps it).
    std::shared_ptr<Run> start(const std::shared_ptr<SpecEngine> & self, GenRequest req);
    const std::shared_ptr<SpecCore> & core() const { return core_; }
    int32_t n_taken() const;

    // SeqRun's side
    void admit(SeqRun * run);
    void on_cancel(SeqRun * run);
    void wait_released(SeqRun * run);

private:
    struct SeqState;
    void loop();
    void run_loop(std::vector<std::unique_ptr<SeqState>> & seqs);
    void prefill_chunk(SeqState & s);
    void iterate(std::vector<SeqState *> & ready);
    void retire(SeqState & s, const char * reason);
    void fail(SeqState & s, const Error & e);
    bool all_cancelled() const;  // under mutex_: every registered call is cancelled
    bool abort_wanted() const;   // under mutex_: a decode now serves no live call

    std::shared_ptr<SpecCore> core_;
    std::vector<std::shared_ptr<std::atomic<bool>>> slots_;  // a sequence is taken (cleared by Run::close)

    mutable std::mutex mutex_;
    std::condition_variable released_cv_;
    std::vector<SeqRun *> incoming_;      // admitted, not yet picked up by the thread
    std::vector<SeqRun *> registered_;    // admitted and not released
    SeqRun * prefilling_ = nullptr;       // the sequence whose prompt chunk is being decoded
    bool running_ = false;
    std::thread worker_;

    // engine thread only
    std::unique_ptr<common_batch> verify_batch_;  // reused by every pass
    SpecCounters shared_;                 // times of the passes (each once), for the totals
    std::vector<int64_t> stage_t_draft_;  // upstream's per-stage draft time, last reading
    int32_t n_live_ = 0, n_generating_ = 0;
    Clock::time_point t_busy_{}, t_gen_first_{}, t_gen_last_{};
};

// Writes an n-gram cache file for the ngram-cache method (llama-lookup-create's format) from tokens.
// Throws Error(Generic) when the file cannot be written.
void ngram_cache_create(const std::vector<llama_token> & tokens, const std::string & path);

void register_speculative(nanobind::module_ & m);

}  // namespace llamaspec
