// The one decode loop of llamaspec: an Engine serves every generation call of a session, plain or
// speculative, on one thread, with one target pass per iteration for all running sequences.
// Plain generation is the same engine with no drafter.
#pragma once

#include <condition_variable>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "speculative.h"  // common
#include "adaptive.h"
#include "call.h"
#include "prompt_cache.h"
#include "stats.h"

namespace llamaspec {

// What the Python face has validated and normalised: upstream method names (none: plain
// generation), limits, n-gram tuning, the number of sequences.
struct SpecConfig {
    std::vector<std::string> methods;  // upstream names ("draft-mtp", "ngram-mod", ...), no duplicates
    int32_t n_draft = 3;               // the cap on every stage's draft, and the rollback depth (0 when plain)
    bool adaptive = false;             // choose the length per verify (n_draft is then the maximum)
    int32_t n_draft_min = 0;           // drafts shorter than this are dropped (draft models, ngram-mod)
    float p_min = 0.0f;                // draft models stop at a token below this probability
    int32_t ngram_size_n = 12;         // key length of ngram-simple / ngram-map-k / ngram-map-k4v
    int32_t ngram_min_hits = 1;        // ngram-map-k / -k4v: hits before a continuation is proposed
    int32_t ngram_mod_n_match = 24;    // ngram-mod: tokens that must match
    std::string ngram_cache_static;    // ngram-cache: optional cache files (common_ngram_cache_save format)
    std::string ngram_cache_dynamic;
    int32_t n_seq = 1;                 // sequences decoded together (each call takes one)
    int32_t ctx_checkpoints = 8;       // prompt-cache checkpoints per sequence (recurrent models)
    int32_t checkpoint_every = 8192;   // and one inside a prompt every this many tokens (0: none)
    int64_t prompt_cache_mb = 0;       // host memory for saved sequences (0: none, -1: no limit)
};

// What the engine decodes with, built by Session::create. Ownership: the draft context (absent for
// plain generation and n-gram-only chains) holds the target context (Context::other_) and its own
// model, so the target outlives it; `spec` refers to both and is declared last, so it is freed first.
struct Core {
    std::shared_ptr<Context> tgt;
    std::shared_ptr<Context> dft;   // null when no stage drafts with a model
    SpecConfig config;
    std::vector<common_speculative_type> stage_types;  // in the order upstream tries them; empty: plain
    std::vector<std::string> stage_names;
    std::unique_ptr<SpecStatsBox> stats;
    std::unique_ptr<DraftLengthPolicy> policy;  // n_draft="auto"; what it learned carries over between calls
    common_speculative_ptr spec;                // null: plain generation

    bool speculative() const { return spec != nullptr; }
};

class Engine;

// The handle of one generation call, what Python holds: events, cancel, close. It shares the
// call's state with the engine and holds the engine (so contexts and speculative state outlive
// the call). close() (also run by the destructor) cancels the call, waits until the engine has let
// go of it, and frees its sequence.
class Run {
public:
    Run(std::shared_ptr<Engine> engine, std::shared_ptr<CallState> call, std::shared_ptr<std::atomic<bool>> slot);
    ~Run();
    Run(const Run &) = delete;
    Run & operator=(const Run &) = delete;

    // Next event, or nullopt after `timeout` (negative: wait forever, zero: only look).
    std::optional<Event> next(std::chrono::microseconds timeout) { return call_->queue.pop(timeout); }
    // Sets this call's cancellation token; the engine drops the call at the end of the current
    // iteration. A decode in flight is interrupted only when it serves no other call. Once the call
    // is over this does nothing: a late cancel never reaches another call.
    void cancel();
    // cancel() + wait for the engine's release + free the sequence. Idempotent. Call without the GIL.
    void close();
    int32_t seq() const { return call_->seq; }
    bool closed() const { return closed_; }
    void set_wake_fd(int fd) { call_->queue.set_wake_fd(fd); }

private:
    std::shared_ptr<Engine> engine_;
    std::shared_ptr<CallState> call_;
    std::shared_ptr<std::atomic<bool>> slot_;  // the sequence is taken
    std::mutex close_mutex_;
    bool closed_ = false;
};

// The decode loop: one thread, started when a call arrives and gone when none is left, serves every
// running call on its own sequence. Each iteration prefills one n_batch chunk of every new call's
// prompt (alone: a cancel can interrupt it without touching the others), then drafts for every
// decoding call in one common_speculative_draft call (none when plain), decodes them all in one
// target pass, and samples, accepts and emits per call. Stats: per sequence (the passes it took part
// in) and in total (each pass once).
class Engine {
public:
    explicit Engine(std::shared_ptr<Core> core);
    ~Engine();
    Engine(const Engine &) = delete;
    Engine & operator=(const Engine &) = delete;

    // Starts a call on a free sequence: validates it (InvalidOption, ContextOverflow), takes a
    // sequence (Busy when none is free), builds its sampler (Grammar) and hands it to the thread.
    // `self` is this engine's owning pointer (the handle keeps it). Call without the GIL.
    std::shared_ptr<Run> start(const std::shared_ptr<Engine> & self, GenRequest req);
    const std::shared_ptr<Core> & core() const { return core_; }
    int32_t n_taken() const;  // sequences taken by a call
    std::vector<SeqCacheInfo> cache_info() const { return cache_.info(); }  // any thread
    RamCacheInfo ram_cache_info() const { return cache_.ram_info(); }      // any thread

    // the handle's side
    void on_cancel(CallState & call);
    void wait_released(CallState & call);

private:
    struct SeqState;
    void admit(const std::shared_ptr<CallState> & call);
    void loop();
    void run_loop(std::vector<std::unique_ptr<SeqState>> & seqs);
    void prefill_chunk(SeqState & s);
    void iterate(std::vector<SeqState *> & ready);
    // Emits sampled tokens up to the call's end, each with its probabilities when `probs` has them (one
    // per id, as sample_and_accept fills it when the call asked; empty otherwise); returns the finish
    // reason, or nullptr.
    // n_drafted: the draft tokens the step verified (0: a plain step); sets each token's Origin
    const char * emit_tokens(SeqState & s, const std::vector<llama_token> & ids, std::vector<TokenProbs> & probs,
                             size_t n_drafted);
    void retire(SeqState & s, const char * reason);
    // At a call's end (reason nullptr: it failed): tells the prompt cache what its sequence holds.
    void keep_cache(SeqState & s, const char * reason);
    void fail(SeqState & s, const Error & e);
    // Drops positions >= p0 of a sequence from both caches; a failure raises DecodeError.
    void seq_rm(llama_seq_id seq, llama_pos p0);
    void leave();                 // under mutex_: the thread leaves (pools parked, leases given back)
    void end_leases();            // under mutex_
    bool all_cancelled() const;   // under mutex_: every registered call is cancelled
    bool abort_wanted() const;    // under mutex_: a decode now serves no live call
    void clear_aborts();          // under mutex_

    std::shared_ptr<Core> core_;
    std::vector<std::shared_ptr<std::atomic<bool>>> slots_;  // a sequence is taken (cleared by Run::close)
    PromptCache cache_;        // what each sequence's memory holds between calls
    uint64_t direct_seen_ = 0;  // the contexts' direct uses the cache has accounted for (under mutex_)

    mutable std::mutex mutex_;
    std::condition_variable released_cv_;
    std::vector<std::shared_ptr<CallState>> incoming_;  // admitted, not yet picked up by the thread
    std::vector<CallState *> registered_;               // admitted and not released
    CallState * prefilling_ = nullptr;                  // the call whose prompt chunk is being decoded
    bool running_ = false;
    std::thread worker_;

    // engine thread only
    std::unique_ptr<common_batch> verify_batch_;  // reused by every pass
    std::vector<int32_t> policy_seqs_, policy_lengths_;  // n_draft="auto": the step's sequences, their lengths
    SpecCounters shared_;                 // times of the passes (each once), for the totals
    SpecCounters stage_time_;             // this iteration's draft time per stage
    std::vector<int64_t> stage_t_draft_;  // upstream's per-stage draft time, last reading
    int32_t n_live_ = 0, n_generating_ = 0;
    Clock::time_point t_busy_{}, t_gen_first_{}, t_gen_last_{};
};

}  // namespace llamaspec
