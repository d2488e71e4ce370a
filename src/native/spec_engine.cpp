// The speculative decode loop: one engine thread per session serves every active sequence, with one
// draft call and one target verify per iteration for all of them (see SpecEngine in spec_session.h
// and docs/architecture.md, "Several sequences").
#include <algorithm>

#include "spec_session.h"

namespace llamaspec {

namespace {
double us_since(Clock::time_point t) { return std::chrono::duration<double, std::micro>(Clock::now() - t).count(); }

// Per-stage time inside draft(): upstream's own counters, read around each draft call.
void add_stage_draft_time(const common_speculative * spec, std::vector<int64_t> & last, SpecCounters & delta) {
    const auto now = common_speculative_get_impl_stats(spec);
    for (size_t i = 0; i < now.size() && i < delta.stages.size(); ++i) {
        if (i < last.size()) delta.stages[i].draft_us += (double) (now[i].t_draft_us - last[i]);
    }
    last.resize(now.size());
    for (size_t i = 0; i < now.size(); ++i) last[i] = now[i].t_draft_us;
}

// An exception as the Error a call fails with (a non-Error one becomes Generic).
Error as_error(const std::exception & e) {
    if (const auto * err = dynamic_cast<const Error *>(&e)) return *err;
    return Error(ErrorKind::Generic, e.what());
}

// common_speculative_process reported a failure of the drafter on `what`.
Error drafter_error(const SpecCore & core, const char * what) {
    return Error(ErrorKind::Generic, std::string("the drafter (") + common_speculative_type_name_str(core.stage_types) +
                                         ") failed to process " + what);
}
}  // namespace

// ---------------------------------------------------------------------------------------------------
// SeqRun: the handle

SeqRun::SeqRun(std::shared_ptr<SpecEngine> engine, llama_seq_id seq, std::shared_ptr<std::atomic<bool>> slot,
               GenRequest req, common_sampler_ptr smpl)
    : Run(engine->core()->tgt, std::move(slot), std::move(req), std::move(smpl)), engine_(std::move(engine)), seq_(seq) {}

void SeqRun::launch() {
    mark_start();
    engine_->admit(this);
}

void SeqRun::cancel() {
    flag_cancel();
    engine_->on_cancel(this);
}

void SeqRun::join_worker() { engine_->wait_released(this); }

// ---------------------------------------------------------------------------------------------------
// the engine: admission, cancellation, release

// What the loop keeps for one sequence (engine thread only).
struct SpecEngine::SeqState {
    SeqRun * run;
    TokenEmitter emitter;
    SpecCounters delta;   // folded into the stats as we go
    SpecCounters call;    // this call's figures, for Done
    llama_tokens prompt_tgt;
    llama_token id_last = -1;
    llama_pos n_past = 0;
    int32_t n_prefilled = 0;  // prompt tokens decoded so far (all but the last are prefilled)
    bool generating = false;  // its first token is out
    bool retired = false;     // handed back: `run` may be gone, never touch it again
    // this iteration
    llama_tokens draft, shadow_draft;
    int32_t n_max = 0;
    bool shadow = false;
    int stage = -1;
    int32_t i_batch = 0;      // its first row in the verify batch

    SeqState(SeqRun * r, const llama_vocab * vocab, size_t n_draft, size_t n_stages)
        : run(r), emitter(vocab, r->queue_, r->req_.stop), delta(n_draft, n_stages), call(n_draft, n_stages) {}
};

SpecEngine::SpecEngine(std::shared_ptr<SpecCore> core)
    : core_(std::move(core)),
      shared_((size_t) core_->config.n_draft, core_->stage_types.size()) {
    for (int32_t i = 0; i < core_->config.n_seq; ++i) slots_.push_back(std::make_shared<std::atomic<bool>>(false));
}

SpecEngine::~SpecEngine() {
    // every run holds this engine, so no sequence is left; the thread is leaving or gone
    if (worker_.joinable()) worker_.join();
}

int32_t SpecEngine::n_taken() const {
    int32_t n = 0;
    for (const auto & s : slots_) n += s->load() ? 1 : 0;
    return n;
}

std::shared_ptr<Run> SpecEngine::start(const std::shared_ptr<SpecEngine> & self, GenRequest req) {
    validate_request(req, *core_->tgt);
    std::shared_ptr<std::atomic<bool>> slot;
    llama_seq_id seq = -1;
    for (size_t i = 0; i < slots_.size() && !slot; ++i) {
        bool expected = false;
        if (slots_[i]->compare_exchange_strong(expected, true)) {
            slot = slots_[i];
            seq = (llama_seq_id) i;
        }
    }
    if (!slot) {
        throw Error(ErrorKind::Busy, slots_.size() == 1
                                         ? std::string("a generation is already running on this session (one at a time)")
                                         : "all " + std::to_string(slots_.size()) +
                                               " sequences of this session are generating (n_seq=" +
                                               std::to_string(slots_.size()) + ")");
    }
    try {
        common_sampler_ptr smpl = make_sampler(*core_->tgt->model(), req.sampling, req.grammar_root);
        auto run = std::make_shared<SeqRun>(self, seq, slot, std::move(req), std::move(smpl));
        run->launch();
        return run;
    } catch (...) {
        slot->store(false);
        throw;
    }
}

void SpecEngine::admit(SeqRun * run) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (abort_wanted()) {
        // every sequence was cancelled and their pass is being aborted: let it finish instead (they
        // leave one iteration later), so that the abort cannot hit this sequence's first pass
        core_->tgt->clear_abort();
        if (core_->dft) core_->dft->clear_abort();
    }
    if (!running_) {
        if (worker_.joinable()) worker_.join();  // the last thread has left its loop
        worker_ = std::thread([this] { loop(); });  // may throw: then nothing is registered yet
        running_ = true;
    }
    run->released_ = false;
    incoming_.push_back(run);
    registered_.push_back(run);
    released_cv_.notify_all();  // a closer waiting for the thread to leave: it stays now
}

bool SpecEngine::all_cancelled() const {
    return !registered_.empty() &&
           std::all_of(registered_.begin(), registered_.end(), [](const SeqRun * r) { return r->cancelled(); });
}

bool SpecEngine::abort_wanted() const {
    return (prefilling_ != nullptr && prefilling_->cancelled()) || all_cancelled();
}

void SpecEngine::on_cancel(SeqRun * run) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (run->released_) return;
    if (all_cancelled()) {
        core_->tgt->request_abort();
        if (core_->dft) core_->dft->request_abort();
    } else if (prefilling_ == run) {
        // its own prompt chunk, on the target only: the drafter's part of that chunk may decode
        // other sequences' deferred rows (patch 0005), which must not be cut short
        core_->tgt->request_abort();
    }
    // otherwise the others go on and it leaves at the end of the iteration
}

void SpecEngine::wait_released(SeqRun * run) {
    std::unique_lock<std::mutex> lock(mutex_);
    // the last sequence out also waits for the thread to leave, so that a closed call leaves no
    // thread behind (and a session's threads are countable)
    released_cv_.wait(lock, [this, run] { return run->released_ && (!registered_.empty() || !running_); });
    if (!running_ && worker_.joinable()) worker_.join();  // it has left its loop: only returning is left
}

void SpecEngine::retire(SeqState & s, const char * reason) {
    SeqRun & r = *s.run;
    r.close_window();
    GenStats & stats = r.stats_;
    const Clock::time_point now = Clock::now();
    // the session's wall times: the union of the calls' spans (total) and generation windows
    if (s.generating && --n_generating_ == 0) shared_.window_s += seconds(t_gen_last_ - t_gen_first_);
    if (--n_live_ == 0) shared_.total_us += std::chrono::duration<double, std::micro>(now - t_busy_).count();
    s.delta.total_us += std::chrono::duration<double, std::micro>(now - r.t_start_).count();
    if (stats.tokens > 1) {
        s.delta.rate_tokens += (uint64_t) stats.tokens - 1;
        s.delta.window_s += stats.generation_s;
    }
    core_->stats->fold(s.run->seq_, s.delta, shared_, true);
    // a fresh start for the next call on this sequence
    llama_memory_seq_rm(llama_get_memory(core_->tgt->get()), r.seq_, -1, -1);
    if (core_->dft) llama_memory_seq_rm(llama_get_memory(core_->dft->get()), r.seq_, -1, -1);
    if (reason != nullptr) {
        r.finish(stats, reason,
                 {{"iterations", (double) s.call.iterations},
                  {"drafts_generated", (double) s.call.drafts_generated},
                  {"drafts_accepted", (double) s.call.drafts_accepted},
                  {"seq", (double) r.seq_}});
    }
    s.retired = true;
    std::lock_guard<std::mutex> lock(mutex_);
    registered_.erase(std::find(registered_.begin(), registered_.end(), &r));
    r.released_ = true;  // from here on the consumer may close and free it
    released_cv_.notify_all();
}

void SpecEngine::fail(SeqState & s, const Error & e) {
    s.emitter.abandon();
    s.run->queue_.push(Event{Event::Failure, -1, {}, s.run->stats_, e});
    retire(s, nullptr);
}

// ---------------------------------------------------------------------------------------------------
// the loop

void SpecEngine::loop() {
    std::vector<std::unique_ptr<SeqState>> seqs;
    try {
        run_loop(seqs);
    } catch (const std::exception & e) {
        // not expected (errors are per sequence or per pass, handled inside); never leave a caller waiting
        const Error err = as_error(e);
        for (auto & s : seqs) {
            if (s && !s->retired) fail(*s, err);
        }
        std::lock_guard<std::mutex> lock(mutex_);
        for (SeqRun * r : incoming_) {
            r->queue_.push(Event{Event::Failure, -1, {}, r->stats_, err});
            registered_.erase(std::find(registered_.begin(), registered_.end(), r));
            r->released_ = true;
        }
        incoming_.clear();
        released_cv_.notify_all();
        running_ = false;
    }
}

void SpecEngine::run_loop(std::vector<std::unique_ptr<SeqState>> & seqs) {
    const llama_vocab * vocab = core_->tgt->model()->vocab();
    const size_t n_draft = (size_t) core_->config.n_draft, n_stages = core_->stage_types.size();
    std::vector<SeqState *> ready;
    while (true) {
        {
            std::lock_guard<std::mutex> lock(mutex_);
            seqs.reserve(seqs.size() + incoming_.size());  // so that the pick-up below cannot throw halfway
            for (SeqRun * r : incoming_) {
                seqs.push_back(std::make_unique<SeqState>(r, vocab, n_draft, n_stages));
                if (n_live_++ == 0) t_busy_ = r->t_start_;
            }
            incoming_.clear();
            if (seqs.empty()) {
                running_ = false;
                released_cv_.notify_all();
                return;
            }
            // an abort asked for a pass that is over (or that only served cancelled sequences)
            if (!abort_wanted()) {
                core_->tgt->clear_abort();
                if (core_->dft) core_->dft->clear_abort();
            }
        }
        // prompts: one n_batch chunk of each new sequence per iteration, so a long prompt does not
        // stall the sequences that are generating
        ready.clear();
        for (auto & s : seqs) {
            if (s->run->cancelled()) continue;  // retired below
            if (s->id_last < 0) {
                try {
                    prefill_chunk(*s);
                } catch (const Error & e) {
                    fail(*s, e);
                    s.reset();
                    continue;
                }
            }
            if (s->id_last >= 0 && !s->run->cancelled()) ready.push_back(s.get());  // joins this iteration's pass
        }
        seqs.erase(std::remove(seqs.begin(), seqs.end(), nullptr), seqs.end());
        if (!ready.empty()) iterate(ready);
        // cancelled sequences leave here (also those that were waiting for their prompt)
        for (auto & s : seqs) {
            if (s->retired) {  // finished inside iterate
                s.reset();
            } else if (s->run->cancelled()) {
                s->emitter.abandon();
                retire(*s, "cancelled");
                s.reset();
            }
        }
        seqs.erase(std::remove(seqs.begin(), seqs.end(), nullptr), seqs.end());
    }
}

void SpecEngine::prefill_chunk(SeqState & s) {
    SeqRun & r = *s.run;
    llama_context * ctx_tgt = core_->tgt->get();
    common_speculative * spec = core_->spec.get();
    const llama_seq_id seq = r.seq_;
    const std::vector<llama_token> & prompt = r.req_.prompt;
    const int32_t n_prefix = (int32_t) prompt.size() - 1;
    const Clock::time_point t0 = Clock::now();
    if (s.n_prefilled == 0) {
        // a fresh start for every call: both caches and the recurrent state of this sequence
        llama_memory_seq_rm(llama_get_memory(ctx_tgt), seq, -1, -1);
        if (core_->dft) llama_memory_seq_rm(llama_get_memory(core_->dft->get()), seq, -1, -1);
    }
    if (s.n_prefilled < n_prefix) {
        // every prompt token but the last, in n_batch chunks, each fed to the drafter
        const int32_t n_batch = (int32_t) std::max<uint32_t>(1, llama_n_batch(ctx_tgt));
        const int32_t end = std::min(n_prefix, s.n_prefilled + n_batch);
        common_batch batch(ctx_tgt);
        for (int32_t i = s.n_prefilled; i < end; ++i) batch.add(prompt[i], i, seq, false);
        // while this chunk decodes, a cancel of this call may abort it (and nothing else)
        struct Prefilling {
            SpecEngine & e;
            Prefilling(SpecEngine & engine, SeqRun & run) : e(engine) {
                std::lock_guard<std::mutex> lock(e.mutex_);
                e.prefilling_ = &run;
                if (run.cancelled()) e.core_->tgt->request_abort();  // cancelled just now: this chunk is its own
            }
            ~Prefilling() {  // also when the decode throws
                std::lock_guard<std::mutex> lock(e.mutex_);
                e.prefilling_ = nullptr;
                if (!e.abort_wanted()) {  // an abort meant for this chunk must not reach the next pass
                    e.core_->tgt->clear_abort();
                    if (e.core_->dft) e.core_->dft->clear_abort();
                }
            }
        };
        int rc = 0;
        bool ok = false;
        {
            Prefilling guard(*this, r);
            rc = llama_process(ctx_tgt, LLAMA_PROCESS_TYPE_DECODE, batch.get());
            ok = rc == 0 && common_speculative_process(spec, batch);
        }
        r.stats_.prefill_s += seconds(Clock::now() - t0);
        if (rc != 0 && rc != 2) r.decode_ok(rc, "prompt decode");  // throws DecodeError
        if (rc == 2 || r.cancelled()) return;  // an abort only ever stops a cancelled sequence: it leaves as such
        if (!ok) {
            throw drafter_error(*core_, "the prompt");
        }
        s.n_prefilled = end;
    }
    const double us = us_since(t0);
    s.delta.prefill_us += us;
    shared_.prefill_us += us;
    if (s.n_prefilled < n_prefix) return;  // more chunks next iteration
    for (llama_token t : prompt) common_sampler_accept(r.smpl_.get(), t, false);
    s.prompt_tgt.assign(prompt.begin(), prompt.end() - 1);
    s.prompt_tgt.reserve(core_->tgt->n_ctx());
    s.id_last = prompt.back();
    s.n_past = n_prefix;
    common_speculative_begin(spec, seq, s.prompt_tgt);
}

void SpecEngine::iterate(std::vector<SeqState *> & ready) {
    SpecCore & core = *core_;
    llama_context * ctx_tgt = core.tgt->get();
    llama_context * ctx_dft = core.dft ? core.dft->get() : nullptr;
    common_speculative * spec = core.spec.get();
    const int32_t n_draft = core.config.n_draft;
    const int32_t n_ctx = (int32_t) core.tgt->n_ctx();
    const size_t n_stages = core.stage_types.size();
    DraftLengthPolicy * policy = core.policy.get();  // n_seq == 1 only

    // draft for every sequence in one call: never more than the tokens still wanted after the one
    // the verify yields anyway
    Clock::time_point t0 = Clock::now();
    bool any_draft = false;
    for (SeqState * s : ready) {
        SeqRun & r = *s->run;
        const int32_t remaining = r.req_.max_tokens - r.stats_.tokens;
        const int32_t wanted = policy ? policy->choose() : n_draft;
        const int32_t room = std::min(remaining - 1, n_ctx - (int32_t) s->n_past - 2);
        s->n_max = std::max(0, std::min(wanted, room));
        // a shadow draft (n_draft="auto", plain step): drafted, compared with what the plain step
        // samples, never verified
        s->shadow = policy && s->n_max == 0 && policy->shadow() && policy->shadow_length() <= room;
        const int32_t n_ask = s->shadow ? policy->shadow_length() : s->n_max;
        ++s->delta.draft_length_histogram[(size_t) s->n_max];
        s->draft.clear();
        s->shadow_draft.clear();
        s->stage = -1;
        if (n_ask > 0) {
            common_speculative_get_draft_params(spec, r.seq_) = {
                /* .drafting = */ true,
                /* .n_max    = */ n_ask,
                /* .pos0     = */ s->n_past,
                /* .id_last  = */ s->id_last,
                /* .prompt   = */ &s->prompt_tgt,
                /* .result   = */ &s->draft,
            };
            any_draft = true;
        }
    }
    SpecCounters stage_time((size_t) n_draft, n_stages);
    if (any_draft) {
        common_speculative_draft(spec);
        add_stage_draft_time(spec, stage_t_draft_, stage_time);
    }
    for (SeqState * s : ready) {
        const int32_t n_ask = s->shadow ? policy->shadow_length() : s->n_max;
        if ((int32_t) s->draft.size() > n_ask) s->draft.resize(n_ask);
        if (s->shadow) {
            s->shadow_draft.swap(s->draft);  // the verify below is a plain step
        } else if (!s->draft.empty()) {
            const common_speculative_type t = common_speculative_get_last_type(spec, s->run->seq_);
            for (size_t i = 0; i < n_stages; ++i) {
                if (core.stage_types[i] == t) s->stage = (int) i;
            }
        }
        // the draft context must not run ahead of the target's positions
        if (ctx_dft) {
            const llama_seq_id seq = s->run->seq_;
            llama_memory_seq_rm(llama_get_memory(ctx_dft), seq, llama_memory_seq_pos_max(llama_get_memory(ctx_tgt), seq) + 1, -1);
        }
    }
    const double draft_us = us_since(t0);
    shared_.draft_us += draft_us;
    for (size_t i = 0; i < n_stages; ++i) shared_.stages[i].draft_us += stage_time.stages[i].draft_us;
    for (SeqState * s : ready) {
        if (s->n_max > 0 || s->shadow) {
            s->delta.draft_us += draft_us;
            for (size_t i = 0; i < n_stages; ++i) s->delta.stages[i].draft_us += stage_time.stages[i].draft_us;
        }
    }

    // verify every sequence's [id_last, draft...] in one target pass, all rows with logits
    t0 = Clock::now();
    const Clock::time_point t_rest = t0;
    if (!verify_batch_) verify_batch_ = std::make_unique<common_batch>(ctx_tgt);
    common_batch & batch = *verify_batch_;
    batch.clear();
    for (SeqState * s : ready) {
        const llama_seq_id seq = s->run->seq_;
        s->i_batch = batch.size();
        batch.add(s->id_last, s->n_past, seq, true);
        for (size_t i = 0; i < s->draft.size(); ++i) batch.add(s->draft[i], s->n_past + 1 + (llama_pos) i, seq, true);
    }
    const int rc = llama_process(ctx_tgt, LLAMA_PROCESS_TYPE_DECODE, batch.get());
    if (rc == 2) return;  // aborted: every sequence was cancelled; they leave as such
    if (rc != 0) {
        const Error e = Error::with_code(ErrorKind::Decode, "verify decode failed: llama_decode returned " + std::to_string(rc), rc);
        for (SeqState * s : ready) fail(*s, e);
        return;
    }
    if (!common_speculative_process(spec, batch)) {
        bool all_cancelled = true;
        for (SeqState * s : ready) all_cancelled = all_cancelled && s->run->cancelled();
        if (all_cancelled) return;  // the abort reached the draft context's catch-up decode
        const Error e = drafter_error(core, "the verify batch");
        for (SeqState * s : ready) fail(*s, e);
        return;
    }
    const double verify_us = us_since(t0);
    shared_.verify_us += verify_us;
    ++shared_.passes;

    // per sequence: sample every row with its own sampler (one draw per emitted token, as plain
    // decoding), accept, emit, roll back the rejected positions
    double sample_us = 0;
    std::vector<int> idxs;
    for (SeqState * s : ready) {
        try {
            SeqRun & r = *s->run;
            const llama_seq_id seq = r.seq_;
            SpecCounters & delta = s->delta;
            delta.verify_us += verify_us;
            ++delta.passes;
            const Clock::time_point ts = Clock::now();
            idxs.resize(s->draft.size() + 1);
            for (size_t i = 0; i < idxs.size(); ++i) idxs[i] = s->i_batch + (int) i;
            const std::vector<llama_token> ids = common_sampler_sample_and_accept_n(r.smpl_.get(), ctx_tgt, idxs, s->draft);
            const double us = us_since(ts);
            delta.sample_us += us;
            sample_us += us;
            const size_t n_acc = ids.size() - 1;
            // a shadow draft that matched is reported as accepted: the drafter's own bookkeeping (n-gram
            // statistics, low-acceptance resets) then sees what really happened; hidden-state drafters
            // clamp to the rows verified, here the one row of the plain step
            const bool shadow_hit = !s->shadow_draft.empty() && s->shadow_draft[0] == ids[0];
            common_speculative_accept(spec, seq, (uint16_t) (shadow_hit ? 1 : n_acc));
            if (s->shadow) {
                ++delta.shadow_drafts;
                delta.shadow_accepted += shadow_hit ? 1 : 0;
            }

            ++delta.iterations;
            ++s->call.iterations;
            delta.drafts_generated += s->draft.size();
            s->call.drafts_generated += s->draft.size();
            delta.drafts_accepted += n_acc;
            s->call.drafts_accepted += n_acc;
            for (size_t i = 0; i < s->draft.size() && i < delta.drafted_per_position.size(); ++i) {
                ++delta.drafted_per_position[i];
                if (i < n_acc) ++delta.accepted_per_position[i];
            }
            if (s->stage >= 0) {
                StageCounters & sc = delta.stages[(size_t) s->stage];
                ++sc.drafts;
                sc.drafts_generated += s->draft.size();
                sc.drafts_accepted += n_acc;
                for (size_t i = 0; i < s->draft.size() && i < sc.drafted_per_position.size(); ++i) {
                    ++sc.drafted_per_position[i];
                    if (i < n_acc) ++sc.accepted_per_position[i];
                }
            }
            s->n_past += 1 + (llama_pos) n_acc;

            // emit, exactly up to max_tokens, an end-of-generation token or a stop string
            const int32_t before = r.stats_.tokens;
            const char * reason = nullptr;
            for (llama_token id : ids) {
                s->prompt_tgt.push_back(s->id_last);
                s->id_last = id;
                reason = r.emit(s->emitter, id);
                if (r.stats_.tokens > before && !s->generating) {
                    s->generating = true;
                    if (n_generating_++ == 0) t_gen_first_ = r.t_first_;
                }
                if (reason) break;
            }
            if (r.stats_.tokens > before) t_gen_last_ = std::max(t_gen_last_, r.t_last_);
            delta.tokens_emitted += (uint64_t) (r.stats_.tokens - before);
            if (reason) {
                retire(*s, reason);
                continue;
            }
            // drop the rejected positions from both caches
            llama_memory_seq_rm(llama_get_memory(ctx_tgt), seq, s->n_past, -1);
            if (ctx_dft) llama_memory_seq_rm(llama_get_memory(ctx_dft), seq, s->n_past, -1);
            if (policy) {
                if (s->shadow) policy->observe_shadow(!s->shadow_draft.empty(), shadow_hit, draft_us);
                // a shadow step's cost is a plain step's: its drafting time is reported apart, above
                policy->observe(s->n_max, (int32_t) s->draft.size(), (int32_t) n_acc, s->shadow ? 0.0 : draft_us,
                                us_since(t_rest));
            }
        } catch (const std::exception & e) {  // one call's failure (a grammar that cannot go on, ...) ends that call only
            fail(*s, as_error(e));
        }
    }
    shared_.sample_us += sample_us;
    // publish; never waits for a reader
    for (SeqState * s : ready) {
        if (!s->retired) core.stats->fold(s->run->seq_, s->delta, shared_, false);
    }
}

}  // namespace llamaspec
