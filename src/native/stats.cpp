// Sums, publication and the Python view of the generation counters (the list is in stats.h).
#include "stats.h"

#include <algorithm>

#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

namespace nb = nanobind;

namespace llamaspec {

namespace {
void add_vec(std::vector<uint64_t> & a, const std::vector<uint64_t> & b) {
    for (size_t i = 0; i < a.size() && i < b.size(); ++i) a[i] += b[i];
}
}  // namespace

void StageCounters::add(const StageCounters & o) {
    drafts += o.drafts;
    drafts_generated += o.drafts_generated;
    drafts_accepted += o.drafts_accepted;
    draft_us += o.draft_us;
    add_vec(drafted_per_position, o.drafted_per_position);
    add_vec(accepted_per_position, o.accepted_per_position);
}

void SpecCounters::add_counts(const SpecCounters & o) {
#define LLAMASPEC_ADD(type, name) name += o.name;
    LLAMASPEC_COUNTS(LLAMASPEC_ADD)
    add_vec(drafted_per_position, o.drafted_per_position);
    add_vec(accepted_per_position, o.accepted_per_position);
    add_vec(draft_length_histogram, o.draft_length_histogram);
    for (size_t i = 0; i < stages.size() && i < o.stages.size(); ++i) {
        const double t = stages[i].draft_us;
        stages[i].add(o.stages[i]);
        stages[i].draft_us = t;
    }
}

void SpecCounters::add_timing(const SpecCounters & o) {
    LLAMASPEC_TIMES(LLAMASPEC_ADD)
#undef LLAMASPEC_ADD
    for (size_t i = 0; i < stages.size() && i < o.stages.size(); ++i) stages[i].draft_us += o.stages[i].draft_us;
}

void SpecCounters::clear() {  // in place: the engine clears its deltas at every publication
#define LLAMASPEC_ZERO(type, name) name = 0;
    LLAMASPEC_COUNTS(LLAMASPEC_ZERO)
    LLAMASPEC_TIMES(LLAMASPEC_ZERO)
#undef LLAMASPEC_ZERO
    for (auto * v : {&drafted_per_position, &accepted_per_position, &draft_length_histogram}) {
        std::fill(v->begin(), v->end(), 0);
    }
    for (auto & st : stages) {
        st.drafts = st.drafts_generated = st.drafts_accepted = 0;
        st.draft_us = 0;
        std::fill(st.drafted_per_position.begin(), st.drafted_per_position.end(), 0);
        std::fill(st.accepted_per_position.begin(), st.accepted_per_position.end(), 0);
    }
}

nb::dict SpecCounters::to_dict(const std::vector<std::string> & stage_names) const {
    nb::dict d;
#define LLAMASPEC_PUT(type, name) d[#name] = name;
    LLAMASPEC_COUNTS(LLAMASPEC_PUT)
    LLAMASPEC_TIMES(LLAMASPEC_PUT)
#undef LLAMASPEC_PUT
    d["drafted_per_position"] = nb::cast(drafted_per_position);
    d["accepted_per_position"] = nb::cast(accepted_per_position);
    d["draft_length_histogram"] = nb::cast(draft_length_histogram);
    nb::list out;
    for (size_t i = 0; i < stages.size() && i < stage_names.size(); ++i) {
        const StageCounters & sc = stages[i];
        nb::dict sd;
        sd["method"] = stage_names[i];
        sd["drafts"] = sc.drafts;
        sd["drafts_generated"] = sc.drafts_generated;
        sd["drafts_accepted"] = sc.drafts_accepted;
        sd["draft_us"] = sc.draft_us;
        sd["drafted_per_position"] = nb::cast(sc.drafted_per_position);
        sd["accepted_per_position"] = nb::cast(sc.accepted_per_position);
        out.append(sd);
    }
    d["stages"] = out;
    return d;
}

bool SpecStatsBox::fold(int32_t seq, SpecCounters & seq_delta, SpecCounters & engine_delta, bool wait) {
    std::unique_lock<std::mutex> lock(mutex_, std::defer_lock);
    if (wait) {
        lock.lock();
    } else if (!lock.try_lock()) {
        return false;
    }
    totals_.add_counts(seq_delta);
    totals_.add_timing(engine_delta);
    if (seq >= 0 && (size_t) seq < per_seq_.size()) per_seq_[(size_t) seq].add(seq_delta);
    seq_delta.clear();
    engine_delta.clear();
    return true;
}

SpecCounters SpecStatsBox::snapshot(int32_t seq) const {
    std::lock_guard<std::mutex> lock(mutex_);
    return seq >= 0 && (size_t) seq < per_seq_.size() ? per_seq_[(size_t) seq] : totals_;
}

void SpecStatsBox::reset() {
    std::lock_guard<std::mutex> lock(mutex_);
    totals_.clear();
    for (auto & c : per_seq_) c.clear();
}

}  // namespace llamaspec
