// Speculative decoding sessions driven by upstream common_speculative: MTP first (the drafter is
// the Multi-Token-Prediction head in the target's own GGUF).
#pragma once

#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include <nanobind/nanobind.h>

#include "speculative.h"  // common
#include "generator.h"

namespace llamaspec {

// Counters of speculative generation. Used both as running totals and as the deltas a worker
// accumulates between two publications.
struct SpecCounters {
    uint64_t iterations = 0;        // verify passes (the prompt pass is not one)
    uint64_t drafts_generated = 0;  // draft tokens proposed
    uint64_t drafts_accepted = 0;   // draft tokens the target accepted
    uint64_t tokens_emitted = 0;    // Token events
    uint64_t rate_tokens = 0;       // sum over calls of (tokens - 1): the numerator of tokens/s
    double window_s = 0;            // sum over calls of first-to-last-token time
    double draft_us = 0, verify_us = 0, sample_us = 0, prefill_us = 0, total_us = 0;
    std::vector<uint64_t> drafted_per_position;   // [n_draft]
    std::vector<uint64_t> accepted_per_position;  // [n_draft]

    explicit SpecCounters(size_t n_draft = 0) : drafted_per_position(n_draft, 0), accepted_per_position(n_draft, 0) {}
    void add(const SpecCounters & o);
    void clear();
};

// The session's cumulative statistics, readable from any thread at any time. The worker folds its
// deltas in with try_lock (it never waits for a reader); a reader copies under the lock, so every
// snapshot is a consistent set of counters.
class SpecStatsBox {
public:
    explicit SpecStatsBox(size_t n_draft) : totals_(n_draft) {}
    bool try_fold(SpecCounters & delta);  // worker, per iteration: folds and clears delta if free
    void fold(SpecCounters & delta);      // worker, at the end of a call
    SpecCounters snapshot() const;
    void reset();

private:
    mutable std::mutex mutex_;
    SpecCounters totals_;
};

// What a SpecRun needs, shared with the session (shared_ptr): contexts, the common_speculative state,
// the stats. Ownership: the draft context holds the target context (Context::other_), so the target
// outlives it; `spec` refers to both and is declared last, so it is freed first.
struct SpecCore {
    std::shared_ptr<Context> tgt;
    std::shared_ptr<Context> dft;
    int32_t n_draft = 3;
    std::vector<std::string> methods;
    SpecStatsBox stats;
    common_speculative_ptr spec;

    SpecCore(size_t n_draft) : stats(n_draft) {}
};

// The engine behind llamaspec.MTP: one generation at a time, reusable across calls.
class SpecSession {
public:
    // Builds the target context (n_rs_seq = n_draft, 1 + n_draft outputs), the MTP draft context
    // (ctx_type MTP, n_rs_seq 0, ctx_other = target) and the speculative state, in the order that
    // works (init before the first target decode). Throws Error. Call without the GIL.
    static std::shared_ptr<SpecSession> create_mtp(std::shared_ptr<Model> model, llama_context_params params,
                                                   int32_t n_draft);

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

void register_speculative(nanobind::module_ & m);

}  // namespace llamaspec
