// The adaptive draft length (n_draft="auto"): for each verify, the draft length that maximises the
// expected tokens per second, from the acceptance the session observes (per position, and replayed
// over the text it drafted for the lengths it is not drafting) and the draft and verify costs it
// measures on this machine; 0 (plain decoding) when drafting does not pay, with probes from time to
// time so that a change in the text is noticed. Design and evidence: ADR 0009.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace llamaspec {

class DraftLengthPolicy {
public:
    // n_max: the largest length it may choose (sizes everything); n_min: shorter non-zero drafts are
    // dropped by the drafter anyway, so the choice is 0 or within [max(1, n_min), n_max].
    DraftLengthPolicy(int32_t n_max, int32_t n_min);

    // The draft length for the next verify; 0 is a plain step.
    int32_t choose();

    // Whether the plain step just chosen should carry a shadow draft: the drafter proposes
    // shadow_length() tokens that are not verified; the caller compares the first with the token the
    // plain step produces and reports it with observe_shadow(). Acceptance is measured without paying
    // for a verify (ADR 0009).
    bool shadow() const { return shadow_; }
    int32_t shadow_length() const { return n_min_; }

    // What a shadow draft did: whether the drafter produced a token, whether it equals the token the
    // plain step sampled, and the time the drafter took, in microseconds.
    void observe_shadow(bool drafted, bool accepted, double draft_us);

    // What that verify did: the length asked for, the drafts the drafter actually produced, how many
    // the target accepted, and the time spent drafting and in the rest of the iteration (verify,
    // drafter bookkeeping, sampling, emission), in microseconds.
    void observe(int32_t n_requested, int32_t n_drafted, int32_t n_accepted, double draft_us, double rest_us);

    // The model's current view, for tests and the ADR's evidence: expected tokens per verify and
    // expected microseconds per verify for length k.
    double expected_tokens(int32_t k) const;
    double expected_us(int32_t k) const;

private:
    // a cost table indexed by length, measured where used and interpolated / extrapolated elsewhere
    struct CostTable {
        std::vector<double> ema;     // microseconds
        std::vector<double> weight;  // measurements so far; 0: never measured
        std::vector<double> confidence;  // measurements, faded by the verifies measured since
        void observe(size_t i, double us);
        std::vector<double> filled() const;
    };

    double p_drafted(int32_t i) const;   // P(position i is drafted | asked for and all before accepted)
    // E(k) for k = 0..n_max in one pass over the positions (acceptance: P(position i is accepted |
    // drafted and all before accepted))
    std::vector<double> expected_tokens_by_length() const;
    // what the policy uses: the model's E(r) at the length r of the last verify, times the replay's
    // E(k) / E(r) (ADR 0009); the model alone after a plain step
    std::vector<double> estimated_tokens_by_length() const;
    // the length with the highest tokens[k] / us[k] (the estimates above, the cost table filled in)
    int32_t best(const std::vector<double> & tokens, const std::vector<double> & us) const;
    uint32_t shadow_gap() const;  // plain steps between shadow drafts: their cost within a budget
    // the length to learn instead of k in an exploration slot (k: none), from the same tables
    int32_t explore(int32_t k, const std::vector<double> & tokens, const std::vector<double> & us) const;

    int32_t n_max_, n_min_;
    std::vector<double> asked_, drafted_;     // decayed counts per position
    std::vector<double> tried_, accepted_;    // decayed counts per position
    // the replay (ADR 0009): every length's verifies replayed over the positions this session drafted,
    // as a Markov chain over "drafts accepted so far in this verify"; decayed sums per length
    struct Replay {
        std::vector<std::vector<double>> state;  // by length k: P(j drafts of the current verify accepted), j = 0..k
        std::vector<double> ends;                // by length k: expected verifies that ended, decayed
        double positions = 0, known = 0, accepted = 0;  // decayed counts
        void fade();
        void clear();                            // forget everything; the next position starts a verify
        void add(int acc);                       // one emitted position: 1 accepted, 0 rejected, -1 not drafted
    };
    Replay replay_;
    int32_t last_requested_ = 0;              // the length of the last verify (0: a plain step)
    CostTable iteration_us_;                  // a whole verify, by the length asked for (0: a plain step)
    std::vector<bool> warmed_;                // by length: the first one (graph allocation) was not measured
    std::vector<int32_t> calibration_;        // lengths still to measure, in order (filled once drafting may pay)
    bool calibrated_ = false;
    uint64_t iteration_ = 0;
    uint64_t next_shadow_ = 0;
    uint32_t shadows_ = 0;                    // shadow drafts observed
    double shadow_us_ = 0;                    // their cost (EMA), 0: none yet
    bool shadow_ = false;                     // the step just chosen carries a shadow draft
};

}  // namespace llamaspec
