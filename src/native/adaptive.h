// The adaptive draft length (n_draft="auto"): before every verify, the draft length k with the most
// expected tokens per second, E(k) / T(k), where E(k) comes from the acceptance seen per draft
// position and T(k) from the time verifies of that length took on this machine; 0 (a plain step)
// when no length beats plain decoding. Plain steps carry a cheap unverified "shadow" draft from time
// to time, so a change of text is noticed. Design, constants and evidence: ADR 0009.
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
    // plain step produces and reports it with observe_shadow(): the acceptance of draft position 0,
    // measured without paying for a verify.
    bool shadow() const { return shadow_; }
    int32_t shadow_length() const { return n_min_; }

    // What a shadow draft did: whether the drafter produced a token, whether it equals the token the
    // plain step sampled, and the time the drafter took, in microseconds.
    void observe_shadow(bool drafted, bool accepted, double draft_us);

    // What a step did: the length asked for (0: a plain step), the drafts the drafter produced, how
    // many the target accepted, and the time spent drafting and in the rest of the iteration (verify,
    // drafter bookkeeping, sampling, emission), in microseconds.
    void observe(int32_t n_requested, int32_t n_drafted, int32_t n_accepted, double draft_us, double rest_us);

    // The model's current view, for tests and the ADR: E(k), expected tokens per verify of length k,
    // and T(k), expected microseconds per verify of length k (0: a plain step; 0 when not yet known).
    double expected_tokens(int32_t k) const;
    double expected_us(int32_t k) const;

private:
    // The recent measurements of one cost (a verify length, or shadow drafts).
    struct Cost {
        std::vector<double> recent;  // the last kCostWindow measurements, a ring
        size_t next = 0;
        bool warmed = false;         // the first measurement (graph allocation) was dropped
        uint64_t at = 0;             // iteration of the last measurement
        void add(double us, uint64_t iteration);
        double mean() const;         // their mean without the largest (one preempted verify)
    };

    bool known(int32_t k) const;            // T(k) was measured, recently enough (plain: ever)
    std::vector<double> tokens() const;     // E(k), k = 0..n_max
    std::vector<double> costs() const;      // T(k), k = 0..n_max: measured, else estimated
    int32_t best(const std::vector<double> & e, const std::vector<double> & t) const;
    void fade();                            // one more drafting observation: older evidence counts less
    void note_draft_time(double per_token_us);  // a drafted token's time, past its warm-up

    int32_t n_max_, n_min_;
    std::vector<double> tried_, accepted_;  // per draft position, decayed counts
    std::vector<Cost> cost_;                // T(k) by length asked for, k = 0..n_max
    Cost catch_up_row_;                     // a shadow draft's extra time per plain step since the last one
    uint32_t shadows_ = 0;                  // shadow drafts observed
    double draft_token_us_ = -1;            // the cheapest draft time per drafted token seen (-1: none)
    uint64_t iteration_ = 0;
    uint64_t verifies_ = 0;                 // drafting steps chosen
    uint64_t next_shadow_ = 0;
    uint64_t previous_shadow_ = 0;          // the iteration of the last shadow draft observed
    bool shadow_ = false;                   // the step just chosen carries a shadow draft
};

}  // namespace llamaspec
