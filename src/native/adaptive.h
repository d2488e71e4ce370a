// The adaptive draft length (n_draft="auto"): before every step, the draft length of each sequence in
// it, so that the step yields the most expected tokens per second: sum over its sequences of E_s(k_s)
// over D(longest k_s) + V(rows), where E_s comes from the acceptance seen per draft position on that
// sequence's text, D from the drafting time of steps with that longest draft (sequences draft in
// lockstep) and V from the time of the rest of steps verifying that many rows, on this machine. A length 0 is a plain step for that sequence, which may carry a
// cheap unverified "shadow" draft so that a change of its text is noticed. Design, constants and
// evidence: ADR 0009.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace llamaspec {

class DraftLengthPolicy {
public:
    // n_max: the longest draft it may choose (sizes everything); n_min: shorter non-zero drafts are
    // dropped by the drafter anyway, so each length is 0 or within [max(1, n_min), n_max]; n_seq:
    // the session's sequences (ids 0 .. n_seq-1); equal_lengths: the target splits a batch into
    // equal-length pieces (recurrent and hybrid models: a batch where sequences verify different
    // numbers of rows runs as several passes), so a step costs as if every sequence verified the
    // longest draft, and rows are counted that way.
    DraftLengthPolicy(int32_t n_max, int32_t n_min, int32_t n_seq = 1, bool equal_lengths = false);

    // The lengths for one step: lengths[i] for seqs[i] (each id once), 0 being a plain step; then
    // shadow(seq) tells whether a sequence's plain step carries a shadow draft: the drafter
    // proposes shadow_length() tokens that are not verified, and the caller compares the first with
    // the token the plain step produces (observe_shadow): the acceptance of draft position 0,
    // measured without paying for a verify.
    void choose(const std::vector<int32_t> & seqs, std::vector<int32_t> & lengths);
    bool shadow(int32_t seq) const;
    int32_t shadow_length() const { return n_min_; }
    int32_t n_seq() const { return (int32_t) seqs_.size(); }
    // the rows a step is filed under: each sequence's token plus its draft, or with equal lengths
    // n_seqs * (1 + the longest draft)
    int32_t rows(int32_t n_seqs, int32_t rows_asked, int32_t k_max) const {
        return equal_lengths_ ? n_seqs * (1 + k_max) : rows_asked;
    }

    // What the step did, per sequence: a shadow draft (whether the drafter produced a token, whether
    // it equals the token the plain step sampled, the drafter's time in microseconds, or < 0 when
    // other sequences drafted in the same call, so that it cannot be told apart), or a verify
    // (the length asked for, the drafts produced, how many the target accepted)...
    void observe_shadow(int32_t seq, bool drafted, bool accepted, double draft_us);
    void observe_draft(int32_t seq, int32_t n_requested, int32_t n_drafted, int32_t n_accepted);
    // ...and as a whole: the rows it verified (rows(): each sequence's token plus the drafts asked for), the
    // longest draft asked for (0: none; shadow drafts do not count, their time is reported apart),
    // the time spent drafting and in the rest of the step (verify, bookkeeping, sampling, emission).
    void observe_step(int32_t rows, int32_t k_max, double draft_us, double rest_us);

    // One sequence (id 0) alone: the length of its next verify, whether that plain step carries a
    // shadow draft, and what it did and cost (observe_draft and observe_step together).
    int32_t choose();
    bool shadow() const { return shadow(0); }
    void observe_shadow(bool drafted, bool accepted, double draft_us) { observe_shadow(0, drafted, accepted, draft_us); }
    void observe(int32_t n_requested, int32_t n_drafted, int32_t n_accepted, double draft_us, double rest_us);

    // The model's current view, for tests and the ADR: E_s(k), expected tokens of a verify of length
    // k on sequence seq, and D(k) + V(k + 1), expected microseconds of one sequence's step with a
    // draft of k (0 when not yet known).
    double expected_tokens(int32_t k, int32_t seq = 0) const;
    double expected_us(int32_t k) const;

private:
    // The recent measurements of one cost (a step of so many rows, or a catch-up row).
    struct Cost {
        std::vector<double> recent;  // the last kCostWindow measurements, a ring
        size_t next = 0;
        bool warmed = false;         // the first measurement (graph allocation) was dropped
        uint64_t at = 0;             // iteration of the last measurement
        void add(double us, uint64_t iteration);
        double mean() const;         // their mean without the largest (one preempted verify)
    };
    // What the policy knows of one sequence's text.
    struct Seq {
        std::vector<double> tried, accepted;  // per draft position, decayed counts
        double asked = 0, produced = 0;       // drafts asked for, and those the drafter produced (decayed)
        double answered() const { return (produced + 1.0) / (asked + 1.0); }  // share answered (prior 1 of 1)
        uint64_t next_shadow = 0;             // the first step that may carry its next shadow draft
        uint64_t previous_shadow = 0;         // the step it last drafted (a shadow or a verify)
        uint32_t shadows = 0;                 // shadow drafts observed
        bool shadow = false;                  // its step just chosen carries a shadow draft
    };

    bool known(const std::vector<Cost> & table, int32_t i) const;  // measured recently enough
    std::vector<double> tokens(const Seq & s) const;  // E_s(k), k = 0..n_max
    // V(rows), rows = 0..n_rows, for n sequences, and D(k), k = 0..n_max; `produced`: the share of
    // asks the drafter answers (scales the guesses for what was not measured)
    std::vector<double> verify_costs(int32_t n, double produced) const;
    std::vector<double> draft_costs(double produced) const;
    // t[i] = table[i].mean() for every i >= 1 measured recently enough, appended to `measured`
    void take_measured(const std::vector<Cost> & table, std::vector<double> & t, std::vector<int32_t> & measured) const;
    // fills the entries of t not measured: linear between measured ones, `past` a step after the last
    static void fill(std::vector<double> & t, const std::vector<int32_t> & measured, double past);
    void fade(Seq & s) const;               // one more drafting observation: older evidence counts less
    void note_draft_time(double per_token_us);  // a drafted token's time, past its warm-up

    int32_t n_max_, n_min_, n_rows_;        // n_rows_: the most rows a step verifies
    bool equal_lengths_;
    std::vector<Seq> seqs_;
    std::vector<Cost> cost_;                // V(rows): a step's time after drafting, by rows verified
    std::vector<Cost> draft_cost_;          // D(k): a step's drafting time, by its longest draft
    Cost catch_up_row_;                     // a shadow draft's extra time per plain step since the last one
    double draft_token_us_ = -1;            // the cheapest draft time per drafted token seen (-1: none)
    uint64_t iteration_ = 0;                // steps chosen
    uint64_t drafting_steps_ = 0;           // steps chosen with a draft
    uint64_t plain_steps_ = 0;              // steps where plain was best, and a draft was possible
};

}  // namespace llamaspec
