// The counters of a session's generation (plain or speculative): the one list of them, their sums,
// and the box that publishes them to readers on other threads.
#pragma once

#include <cstdint>
#include <mutex>
#include <vector>

#include <nanobind/nanobind.h>

namespace llamaspec {

// THE list of scalar counters. A new statistic is one line here (it is then summed, cleared and
// handed to Python by name) plus its field in llamaspec.stats.SpecStats.
//
// Counts: a session's totals sum them over its sequences.
#define LLAMASPEC_COUNTS(X)                                                                          \
    X(uint64_t, iterations)       /* verifies of a sequence (the prompt pass is not one) */          \
    X(uint64_t, drafts_generated) /* draft tokens proposed */                                        \
    X(uint64_t, drafts_accepted)  /* draft tokens the target accepted */                             \
    X(uint64_t, tokens_emitted)   /* Token events */                                                 \
    X(uint64_t, shadow_drafts)    /* n_draft="auto": unverified one-token looks in plain steps */     \
    X(uint64_t, shadow_accepted)  /* ... whose token equalled the one the plain step sampled */       \
    X(uint64_t, rate_tokens)      /* sum over calls of (tokens - 1): the numerator of tokens/s */  \
    X(uint64_t, cached_tokens)    /* prompt tokens reused from the sequence's memory (prompt cache) */
// Times: a sequence's are those of the passes it took part in; the totals count each shared pass once.
#define LLAMASPEC_TIMES(X)                                                                           \
    X(uint64_t, passes)           /* target passes: one serves every sequence decoding */            \
    X(double, window_s)           /* first-to-last-token time (totals: while any sequence generates) */ \
    X(double, draft_us)                                                                              \
    X(double, verify_us)                                                                             \
    X(double, sample_us)                                                                             \
    X(double, prefill_us)                                                                            \
    X(double, total_us)

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

// Counters of generation. Used both as running totals and as the deltas the engine accumulates
// between two publications.
struct SpecCounters {
#define LLAMASPEC_FIELD(type, name) type name = 0;
    LLAMASPEC_COUNTS(LLAMASPEC_FIELD)
    LLAMASPEC_TIMES(LLAMASPEC_FIELD)
#undef LLAMASPEC_FIELD
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
    // the counts (LLAMASPEC_COUNTS, the vectors, the stages' counts); totals sum them over sequences...
    void add_counts(const SpecCounters & o);
    // ...but take their times (LLAMASPEC_TIMES, the stages' draft time) from the engine, once per pass
    void add_timing(const SpecCounters & o);
    void clear();
    // Every counter by name (the scalars of both lists, the vectors, one dict per stage with
    // `stage_names[i]` as its "method").
    nanobind::dict to_dict(const std::vector<std::string> & stage_names) const;
};

// The session's cumulative statistics, in total and per sequence, readable from any thread at any
// time. The engine folds its deltas in with try_lock while it generates (it never waits for a
// reader there); a reader copies under the lock, so every snapshot is a consistent set of counters.
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

}  // namespace llamaspec
