// The adaptive draft length (n_draft="auto"): for each verify, the draft length that maximises the
// expected tokens per second, from the acceptance the session observes (per position) and the draft
// and verify costs it measures on this machine; 0 (plain decoding) when drafting does not pay, with
// probes from time to time so that a change in the text is noticed. Design and evidence: ADR 0009.
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

    // The draft length for the next verify.
    int32_t choose();

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
        void observe(size_t i, double us);
        std::vector<double> filled() const;
    };

    double p_drafted(int32_t i) const;   // P(position i is drafted | asked for and all before accepted)
    // E(k) for k = 0..n_max in one pass over the positions (acceptance: P(position i is accepted |
    // drafted and all before accepted))
    std::vector<double> expected_tokens_by_length() const;
    int32_t best() const;

    int32_t n_max_, n_min_;
    std::vector<double> asked_, drafted_;     // decayed counts per position
    std::vector<double> tried_, accepted_;    // decayed counts per position
    CostTable iteration_us_;                  // a whole verify, by the length asked for (0: a plain step)
    std::vector<int32_t> calibration_;        // the lengths of the first verifies
    uint64_t iteration_ = 0;
    uint64_t next_probe_ = 0;
    uint32_t probe_gap_ = 8;                  // iterations between probes while drafting does not pay
    int32_t probing_ = -1;                    // the length of the probe in flight, -1: none
};

}  // namespace llamaspec
