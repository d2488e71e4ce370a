#include "adaptive.h"

#include <algorithm>
#include <cmath>
#include <numeric>

namespace llamaspec {

// The seven constants of the policy; ADR 0009 gives the experiment behind each.
namespace {
constexpr double kDecay = 0.97;          // acceptance evidence fades by this per drafting observation
                                         // (a window of ~33 verifies)
constexpr size_t kCostWindow = 8;        // a cost: the mean of its last 8 measurements, less the largest
constexpr double kSlopeGuess = 0.25;     // a verify's extra row, until measured: +25% of a plain step
                                         // (per sequence)
constexpr double kShadowBudget = 0.01;   // watching (shadow drafts) costs at most 1% of plain decoding...
constexpr uint64_t kLookMax = 32;        // ...but come at least every 32 plain steps while drafting could
                                         // pay; also every 32nd drafting step measures a neighbour
constexpr double kLookMargin = 0.1;      // every 32nd plain step drafts when that is estimated within 10%
                                         // of plain (the spread of a cost's measurements here)
constexpr uint64_t kForget = 512;        // a cost not measured for 512 steps is estimated again
                                         // (measured during a slow spell, it would keep a good
                                         // length out for good)
}  // namespace

void DraftLengthPolicy::Cost::add(double us, uint64_t iteration) {
    if (iteration - at > kForget) {  // forgotten: old measurements do not come back
        recent.clear();
        next = 0;
    }
    at = iteration;
    if (!warmed) {  // a length's first decode allocates its graphs: not the steady state
        warmed = true;
        return;
    }
    if (recent.size() < kCostWindow) {
        recent.push_back(us);
    } else {
        recent[next] = us;
        next = (next + 1) % kCostWindow;
    }
}

double DraftLengthPolicy::Cost::mean() const {
    if (recent.size() < 2) return 0;  // not yet known: one measurement may be a preempted step
    const double sum = std::accumulate(recent.begin(), recent.end(), 0.0);
    if (recent.size() < 3) return sum / (double) recent.size();
    return (sum - *std::max_element(recent.begin(), recent.end())) / (double) (recent.size() - 1);
}

DraftLengthPolicy::DraftLengthPolicy(int32_t n_max, int32_t n_min, int32_t n_seq, bool equal_lengths)
    : n_max_(std::max(1, n_max)), n_min_(std::clamp(n_min, 1, std::max(1, n_max))),
      n_rows_(std::max(1, n_seq) * (n_max_ + 1)), equal_lengths_(equal_lengths), seqs_((size_t) std::max(1, n_seq)), cost_((size_t) n_rows_ + 1),
      draft_cost_((size_t) n_max_ + 1) {
    for (Seq & s : seqs_) {
        s.tried.assign((size_t) n_max_, 0.0);
        s.accepted.assign((size_t) n_max_, 0.0);
    }
}

bool DraftLengthPolicy::known(const std::vector<Cost> & table, int32_t i) const {
    const Cost & c = table[(size_t) i];
    return c.recent.size() >= 2 && iteration_ - c.at <= kForget;
}

std::vector<double> DraftLengthPolicy::tokens(const Seq & s) const {
    // E(k) = 1 + sum_{j=1..k} prod_{i<j} q_i, where q_i is the chance that draft position i is
    // accepted when asked for and every position before it was (a position the drafter did not
    // produce counts as rejected). Each q_i has one pseudo-observation of prior: 0.5 for position 0,
    // the estimate of the position before for the others (acceptance tends to hold along a draft,
    // so positions rarely reached are not dragged to 0.5).
    std::vector<double> e((size_t) n_max_ + 1, 1.0);
    double chain = 1.0, prior = 0.5;
    for (size_t i = 0; i < (size_t) n_max_; ++i) {
        const double q = (s.accepted[i] + prior) / (s.tried[i] + 1.0);
        chain *= q;
        e[i + 1] = e[i] + chain;
        prior = q;
    }
    return e;
}

std::vector<double> DraftLengthPolicy::verify_costs(int32_t n, double produced) const {
    // V(rows): the rest of a step after drafting (verify, drafter bookkeeping, sampling, emission).
    // A row count's own measurements where they are recent (cost curves can be bumpy, one batch
    // size slower than both neighbours); elsewhere linear between the nearest measured
    // row counts; past the largest measured one, kSlopeGuess of a plain step per extra row (per
    // sequence: the rows are shared). (Not the slope of the last two measured: cost curves are
    // concave, on the hybrid MTP fixture a 1-token draft costs 3x a plain step and an 8-token one 6x,
    // so that slope rules out every longer draft.) Row counts below every measured one are left at 0:
    // a step of n sequences verifies n rows at least, and n is measured before anything is drafted.
    std::vector<double> t((size_t) n_rows_ + 1, 0.0);
    std::vector<int32_t> measured;
    take_measured(cost_, t, measured);
    if (measured.empty()) return t;
    const int32_t base = known(cost_, n) ? n : measured[0];
    fill(t, measured, produced * kSlopeGuess * t[(size_t) base] / base);
    return t;
}

std::vector<double> DraftLengthPolicy::draft_costs(double produced) const {
    // D(k): the drafting of a step whose longest draft is k (sequences draft in lockstep: one
    // drafter step per position, for all of them at once); D(0) = 0. Measured where recent, linear
    // in between, past the longest measured one the cheapest draft time per token seen per position.
    std::vector<double> d((size_t) n_max_ + 1, 0.0);
    std::vector<int32_t> measured{0};
    take_measured(draft_cost_, d, measured);
    fill(d, measured, produced * std::max(0.0, draft_token_us_));
    return d;
}

void DraftLengthPolicy::take_measured(const std::vector<Cost> & table, std::vector<double> & t,
                                      std::vector<int32_t> & measured) const {
    for (int32_t i = 1; i < (int32_t) table.size(); ++i) {
        if (known(table, i)) {
            measured.push_back(i);
            t[(size_t) i] = table[(size_t) i].mean();
        }
    }
}

void DraftLengthPolicy::fill(std::vector<double> & t, const std::vector<int32_t> & measured, double past) {
    for (int32_t r = measured[0] + 1; r < (int32_t) t.size(); ++r) {
        const auto hi = std::upper_bound(measured.begin(), measured.end(), r);
        const int32_t lo = *(hi - 1);
        if (lo == r) continue;
        t[(size_t) r] = hi != measured.end()
                            ? t[(size_t) lo] + (t[(size_t) *hi] - t[(size_t) lo]) * (double) (r - lo) / (double) (*hi - lo)
                            : t[(size_t) lo] + past * (double) (r - lo);
    }
}

void DraftLengthPolicy::choose(const std::vector<int32_t> & ids, std::vector<int32_t> & lengths) {
    const uint64_t it = iteration_++;
    const size_t n = ids.size();
    lengths.assign(n, 0);
    if (n == 0) return;
    // A sequence's first two steps are plain, each with a shadow draft (the first one also catches
    // the drafter up on the prompt, so it is not timed), and nothing is drafted before a plain step
    // of this many sequences was measured.
    for (int32_t id : ids) {
        Seq & s = seqs_[(size_t) id];
        s.shadow = s.shadows < 2;
    }
    const int32_t n_plain = (int32_t) n;
    if (!known(cost_, n_plain)) return;

    // The most tokens per second for the step: (sum of E_s(k_s)) / (D(max k_s) + V(n + sum k_s)),
    // or with equal lengths V(n * (1 + max k_s)).
    // For a cap K on every length, the best split of a number of draft tokens gives each next token
    // to the sequence whose next position adds the most expected tokens (E_s grows by less with
    // every position, so this is exact up to n_min); every cap and every number of tokens is tried.
    // Costs are measured by the lengths asked for, so a drafter that often finds nothing to propose
    // (the n-gram methods) is measured at what its steps cost on average; guesses for what was not
    // measured count an asked row at the share of asks the drafter answers.
    std::vector<std::vector<double>> e(n);
    double produced = 0;
    for (size_t i = 0; i < n; ++i) {
        const Seq & s = seqs_[(size_t) ids[i]];
        e[i] = tokens(s);
        produced += s.answered() / (double) n;
    }
    const std::vector<double> v = verify_costs(n_plain, produced);
    const std::vector<double> d = draft_costs(produced);
    std::vector<int32_t> k;
    std::vector<std::pair<size_t, int32_t>> picks;  // (sequence, rows added), in order
    std::vector<int32_t> charged;                   // the rows the step is filed under, after each pick
    // the greedy split under cap K: the picks and the rate after each; the best prefix
    auto split = [&](int32_t cap, std::vector<double> & rates) {
        k.assign(n, 0);
        picks.clear();
        charged.clear();
        rates.clear();
        double expected = (double) n;
        int32_t rows = n_plain, longest = 0;
        for (;;) {
            size_t pick = n;
            double pick_gain = 0;
            int32_t pick_rows = 0;
            for (size_t i = 0; i < n; ++i) {
                if (seqs_[(size_t) ids[i]].shadows < 2) continue;  // still looking
                const int32_t step = k[i] == 0 ? n_min_ : 1;
                if (k[i] + step > cap) continue;
                const double gain = (e[i][(size_t) (k[i] + step)] - e[i][(size_t) k[i]]) / step;
                if (pick == n || gain > pick_gain) {
                    pick = i;
                    pick_gain = gain;
                    pick_rows = step;
                }
            }
            if (pick == n || rows + pick_rows > n_rows_) break;
            k[pick] += pick_rows;
            rows += pick_rows;
            longest = std::max(longest, k[pick]);
            expected += pick_gain * pick_rows;
            picks.emplace_back(pick, pick_rows);
            charged.push_back(this->rows(n_plain, rows, longest));
            rates.push_back(expected / (d[(size_t) longest] + v[(size_t) charged.back()]));
        }
    };
    const double plain_rate = (double) n / v[(size_t) n_plain];
    double draft_rate = 0;  // the best step with a draft
    int32_t best_cap = 0;
    size_t best_n = 0;
    std::vector<double> rates;
    for (int32_t cap = n_min_; cap <= n_max_; ++cap) {
        split(cap, rates);
        for (size_t p = 0; p < rates.size(); ++p) {
            if (rates[p] > draft_rate) {  // ties go to the shorter cap and fewer drafts
                draft_rate = rates[p];
                best_cap = cap;
                best_n = p + 1;
            }
        }
    }
    const double best_rate = std::max(plain_rate, draft_rate);
    if (draft_rate <= plain_rate && best_n > 0) {
        // plain is best; but every kLookMax-th such step takes the best step with a draft when its
        // estimate is within kLookMargin of plain (at most 0.3% of plain decoding) and its cost was
        // measured: near break-even, one slow measurement of a drafting step would otherwise keep
        // drafting out until forgotten (a cost not measured is a guess, which the choice already
        // follows)
        bool look = ++plain_steps_ % kLookMax == 0 && draft_rate >= plain_rate * (1.0 - kLookMargin);
        if (look) {
            split(best_cap, rates);
            look = known(cost_, charged[best_n - 1]);
        }
        if (!look) best_n = 0;
    } else if (best_n > 0) {
        split(best_cap, rates);
        if (++drafting_steps_ % kLookMax == 0) {
            // every kLookMax-th drafting step measures a neighbour instead, one draft token more and
            // one less in turn (within the cap, or the cap one longer): between measured costs the
            // estimates are interpolated, and a bumpy cost curve (or a slow spell of one row count)
            // can hide a cheaper one there
            const bool up = (drafting_steps_ / kLookMax) % 2 == 0;
            if (up && best_n == picks.size() && best_cap < n_max_) split(++best_cap, rates);
            const size_t more = best_n + 1, less = best_n - 1;
            if (up && more <= picks.size()) best_n = more;
            else if (less >= 1) best_n = less;
            else if (more <= picks.size()) best_n = more;
        }
    }
    for (size_t p = 0; p < best_n; ++p) lengths[picks[p].first] += picks[p].second;

    // Plain sequences learn acceptance from shadow drafts only. They matter only if a draft would pay
    // were everything accepted: a draft model as slow as its target never would, and then it is not
    // even kept up to date with the text. A shadow draft after G plain steps costs about d + c * G:
    // d, the draft itself (the cheapest draft time per token seen), and c per row the drafter must
    // catch up on (an MTP head's or a draft model's decode of the text since its last draft).
    // Watching costs (d + c * G) / G per plain step; the gap is the shortest that keeps it within
    // kShadowBudget of a plain step, and no gap can when c alone exceeds it: then the drafter is left
    // idle for that sequence.
    bool full_pays = false;
    for (int32_t j = n_min_; j <= n_max_; ++j) {  // every sequence drafting j, all accepted
        const int32_t r = n_plain * (1 + j);
        full_pays = full_pays || (double) r / (d[(size_t) j] + v[(size_t) r]) > best_rate;
    }
    const double budget = kShadowBudget * v[(size_t) n_plain] / n_plain;
    const double row = catch_up_row_.mean();  // 0 until measured
    for (size_t i = 0; i < n; ++i) {
        Seq & s = seqs_[(size_t) ids[i]];
        if (lengths[i] > 0 || s.shadow) continue;
        if (!full_pays || row >= budget || it < s.next_shadow) continue;
        s.shadow = true;
        const double gap = std::ceil(n_min_ * std::max(0.0, draft_token_us_) / (budget - row));
        s.next_shadow = it + (uint64_t) std::clamp(gap, 1.0, (double) kLookMax);
    }
}

bool DraftLengthPolicy::shadow(int32_t seq) const {
    return seqs_[(size_t) seq].shadow;
}

int32_t DraftLengthPolicy::choose() {
    std::vector<int32_t> lengths;
    choose({0}, lengths);
    return lengths[0];
}

void DraftLengthPolicy::fade(Seq & s) const {
    for (double & x : s.tried) x *= kDecay;
    for (double & x : s.accepted) x *= kDecay;
    s.asked *= kDecay;
    s.produced *= kDecay;
}

void DraftLengthPolicy::note_draft_time(double per_token_us) {
    draft_token_us_ = draft_token_us_ < 0 ? per_token_us : std::min(draft_token_us_, per_token_us);
}

void DraftLengthPolicy::observe_shadow(int32_t seq, bool drafted, bool accepted, double draft_us) {
    // the evidence of a one-position draft that was verified, without the verify
    Seq & s = seqs_[(size_t) seq];
    fade(s);
    s.tried[0] += 1.0;
    s.accepted[0] += drafted && accepted ? 1.0 : 0.0;
    s.asked += 1.0;
    s.produced += drafted ? 1.0 : 0.0;
    // timed only when no sequence verified a draft in the step (else draft_us < 0: the drafting
    // time was theirs too); the first one also caught the drafter up on the prompt
    if (drafted && s.shadows > 0 && draft_us >= 0) {
        note_draft_time(draft_us / n_min_);
        const uint64_t gap = iteration_ - s.previous_shadow;  // steps since it last drafted
        const double draft = n_min_ * draft_token_us_;
        if (gap > 1) catch_up_row_.add(std::max(0.0, draft_us - draft) / (double) (gap - 1), iteration_);
    }
    ++s.shadows;
    s.previous_shadow = iteration_;
}

void DraftLengthPolicy::observe_draft(int32_t seq, int32_t n_requested, int32_t n_drafted, int32_t n_accepted) {
    n_requested = std::clamp(n_requested, 0, n_max_);
    n_drafted = std::clamp(n_drafted, 0, n_requested);
    n_accepted = std::clamp(n_accepted, 0, n_drafted);
    if (n_requested == 0) return;  // plain steps observe no acceptance (their shadow drafts do)
    // all positions fade, also those this verify did not reach: a position no longer observed
    // drifts back toward its prior instead of keeping a stale estimate
    Seq & s = seqs_[(size_t) seq];
    fade(s);
    s.previous_shadow = iteration_;  // the drafter caught up on this sequence here too
    s.asked += 1.0;
    s.produced += n_drafted > 0 ? 1.0 : 0.0;
    for (int32_t i = 0; i < n_requested && i <= n_accepted; ++i) {  // asked, and all before accepted
        s.tried[(size_t) i] += 1.0;
        s.accepted[(size_t) i] += i < n_accepted ? 1.0 : 0.0;
    }
}

void DraftLengthPolicy::observe_step(int32_t rows, int32_t k_max, double draft_us, double rest_us) {
    cost_[(size_t) std::clamp(rows, 1, n_rows_)].add(rest_us, iteration_);
    if (k_max <= 0) return;
    Cost & c = draft_cost_[(size_t) std::min(k_max, n_max_)];
    if (c.warmed) note_draft_time(draft_us / k_max);
    c.add(draft_us, iteration_);
}

void DraftLengthPolicy::observe(int32_t n_requested, int32_t n_drafted, int32_t n_accepted, double draft_us,
                                double rest_us) {
    n_requested = std::clamp(n_requested, 0, n_max_);
    observe_draft(0, n_requested, n_drafted, n_accepted);
    observe_step(1 + n_requested, n_requested, draft_us, rest_us);
}

double DraftLengthPolicy::expected_tokens(int32_t k, int32_t seq) const {
    return tokens(seqs_[(size_t) std::clamp(seq, 0, (int32_t) seqs_.size() - 1)])[(size_t) std::clamp(k, 0, n_max_)];
}

double DraftLengthPolicy::expected_us(int32_t k) const {
    k = std::clamp(k, 0, n_max_);
    const double produced = seqs_[0].answered();
    const std::vector<double> v = verify_costs(1, produced);
    return v[(size_t) k + 1] > 0 ? draft_costs(produced)[(size_t) k] + v[(size_t) k + 1] : 0.0;
}

}  // namespace llamaspec
