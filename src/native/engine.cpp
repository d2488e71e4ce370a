// The decode loop of every session (plain or speculative): one engine thread serves every running
// call, with one draft call (none when plain) and one target pass per iteration for all of them
// (see Engine in engine.h and docs/architecture.md, "How a generation flows").
#include "engine.h"

#include <algorithm>

#include "faults.h"
#include "gil.h"

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

// Samples the rows `idxs` of the last target pass in order with the call's sampler, accepting each
// token, until one differs from the draft (upstream's common_sampler_sample_and_accept_n, which it
// mirrors, with the same break on an end-of-generation token inside the draft); with logprobs on,
// `probs` gets each sampled token's probabilities, read at its own draw.
std::vector<llama_token> sample_and_accept(CallState & c, llama_context * ctx, const std::vector<int> & idxs,
                                           const llama_tokens & draft, std::vector<TokenProbs> & probs) {
    const llama_vocab * vocab = llama_model_get_vocab(llama_get_model(ctx));
    std::vector<llama_token> ids;
    probs.clear();
    for (size_t i = 0; i < idxs.size(); ++i) {
        const llama_token id = common_sampler_sample(c.smpl.get(), ctx, idxs[i]);
        if (c.req.probs.on()) probs.push_back(token_probs(c.req.probs, ctx, idxs[i], c.smpl.get(), id));
        common_sampler_accept(c.smpl.get(), id, true);
        ids.push_back(id);
        if (i == draft.size() || draft[i] != id || (llama_vocab_is_eog(vocab, id) && i + 1 < draft.size())) break;
    }
    return ids;
}

// The exception in flight (inside a catch block) as the Error a call fails with: ours as it is,
// any other std::exception as Generic, anything else as Generic with a fixed message. Nothing that
// is thrown on the engine thread may leave it (std::terminate would end the process).
Error current_error() {
    try {
        throw;
    } catch (const Error & e) {
        return e;
    } catch (const std::exception & e) {
        return Error(ErrorKind::Generic, e.what());
    } catch (...) {
        return Error(ErrorKind::Generic, "the engine thread caught an exception of an unknown type");
    }
}

// A cache rollback (llama_memory_seq_rm) that llama.cpp refused, as the error that ends the call.
Error rollback_error(llama_seq_id seq, llama_pos p0, const char * cache) {
    return Error(ErrorKind::Decode, "could not remove positions >= " + std::to_string(p0) + " of sequence " +
                                        std::to_string(seq) + " from the " + cache + " (rollback failed)");
}

// After a decode: Error(Backend) when an RPC worker of the target or the drafter's model failed
// (what the decode produced is then not to be used); nothing to do for local models.
void check_backends(const Core & core) {
    core.tgt->model()->check_backend(core.tgt->get());
    if (core.dft) core.dft->model()->check_backend(core.dft->get());
}

// common_speculative_process reported a failure of the drafter on `what`.
Error drafter_error(const Core & core, const char * what) {
    return Error(ErrorKind::Generic, std::string("the drafter (") + common_speculative_type_name_str(core.stage_types) +
                                         ") failed to process " + what);
}
}  // namespace

// ---------------------------------------------------------------------------------------------------
// Run: the handle

Run::Run(std::shared_ptr<Engine> engine, std::shared_ptr<CallState> call, std::shared_ptr<std::atomic<bool>> slot)
    : engine_(std::move(engine)), call_(std::move(call)), slot_(std::move(slot)) {}

Run::~Run() {
    GilReleasedIfHeld nogil;  // garbage collection of an unclosed handle waits for the engine's release
    close();
}

void Run::cancel() {
    call_->cancelled.store(true);
    engine_->on_cancel(*call_);
}

void Run::close() {
    std::lock_guard<std::mutex> lock(close_mutex_);
    if (closed_) return;
    cancel();
    engine_->wait_released(*call_);
    closed_ = true;
    slot_->store(false);  // the sequence is free for the next call
}

// ---------------------------------------------------------------------------------------------------
// the engine: admission, cancellation, release

// What the loop keeps for one call (engine thread only).
struct Engine::SeqState {
    std::shared_ptr<CallState> call;
    TokenEmitter emitter;
    SpecCounters delta;    // folded into the stats as we go
    SpecCounters figures;  // this call's own figures, for Done
    llama_tokens prompt_tgt;  // the tokens at positions [0, size) of the memory (what the drafter reads)
    llama_token id_last = -1;  // sampled, not yet decoded (at position n_past)
    llama_pos n_past = 0;
    int32_t n_prefilled = 0;  // prompt tokens in the memory so far (reused ones included)
    bool begun = false;       // its prompt cache is looked up
    bool generating = false;  // its first token is out
    bool retired = false;     // handed back to its handle: never touch the call again
    // this iteration
    llama_tokens draft, shadow_draft;
    int32_t n_max = 0;
    bool shadow = false;
    int stage = -1;
    int32_t i_batch = 0;      // its first row in the verify batch

    SeqState(std::shared_ptr<CallState> c, const llama_vocab * vocab, size_t n_draft, size_t n_stages)
        : call(std::move(c)), emitter(vocab, call->queue, call->req.stop, call->req.sampling.preserved_tokens), delta(n_draft, n_stages),
          figures(n_draft, n_stages) {}
    CallState & c() { return *call; }
};

Engine::Engine(std::shared_ptr<Core> core)
    : core_(std::move(core)),
      shared_((size_t) core_->config.n_draft, core_->stage_types.size()),
      cache_(*core_),
      stage_time_((size_t) core_->config.n_draft, core_->stage_types.size()) {
    for (int32_t i = 0; i < core_->config.n_seq; ++i) slots_.push_back(std::make_shared<std::atomic<bool>>(false));
}

Engine::~Engine() {
    GilReleasedIfHeld nogil;  // joins the thread; then the contexts go
    // every handle holds this engine, so no call is left; the thread is leaving or gone
    if (worker_.joinable()) worker_.join();
}

int32_t Engine::n_taken() const {
    int32_t n = 0;
    for (const auto & s : slots_) n += s->load() ? 1 : 0;
    return n;
}

std::shared_ptr<Run> Engine::start(const std::shared_ptr<Engine> & self, GenRequest req) {
    validate_request(req, *core_->tgt);
    std::shared_ptr<std::atomic<bool>> slot;
    llama_seq_id seq = -1;
    {
        // the free sequence whose cache holds most of this prompt (only here are sequences taken)
        std::lock_guard<std::mutex> lock(mutex_);
        std::vector<bool> free(slots_.size());
        for (size_t i = 0; i < slots_.size(); ++i) free[i] = !slots_[i]->load();
        seq = cache_.choose(free, req.cache_prompt ? req.prompt : std::vector<llama_token>{});
        if (seq >= 0) {
            slot = slots_[(size_t) seq];
            slot->store(true);
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
        auto call = std::make_shared<CallState>(std::move(req), std::move(smpl), seq);
        call->mark_start();
        admit(call);
        return std::make_shared<Run>(self, std::move(call), std::move(slot));
    } catch (...) {
        slot->store(false);
        throw;
    }
}

void Engine::clear_aborts() {
    core_->tgt->clear_abort();
    if (core_->dft) core_->dft->clear_abort();
}

void Engine::end_leases() {
    core_->tgt->end_lease();
    if (core_->dft) core_->dft->end_lease();
}

void Engine::leave() {
    // no decode runs until the next thread, so the CPU thread pools can be parked now (else their
    // threads poll on for new work, slowing the process's other sessions)
    core_->tgt->pause_threadpools();
    if (core_->dft) core_->dft->pause_threadpools();
    core_->tgt->leave_engine_cache();
    if (core_->dft) core_->dft->leave_engine_cache();
    end_leases();
    running_ = false;
    released_cv_.notify_all();
}

void Engine::admit(const std::shared_ptr<CallState> & call) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (abort_wanted()) {
        // every call was cancelled and their pass is being aborted: let it finish instead (they
        // leave one iteration later), so that the abort cannot hit this call's first pass
        clear_aborts();
    }
    if (!running_) {
        // the contexts are the engine's while its thread runs: a direct Context.decode on them
        // (session.context) is refused meanwhile, and one in progress refuses this call
        if (!core_->tgt->try_lease()) {
            throw Error(ErrorKind::Busy, "the session's context is in use by a direct call (Context.decode/clear)");
        }
        if (core_->dft && !core_->dft->try_lease()) {
            core_->tgt->end_lease();
            throw Error(ErrorKind::Busy, "the session's draft context is in use by a direct call");
        }
        if (worker_.joinable()) worker_.join();  // the last thread has left its loop
        // a direct call (Context.decode/clear) changed the memory since: what the cache knew is gone
        const uint64_t direct = core_->tgt->direct_uses() + (core_->dft ? core_->dft->direct_uses() : 0);
        if (direct != direct_seen_) {
            cache_.forget_all();
            direct_seen_ = direct;
        }
        try {
            worker_ = std::thread([this] { loop(); });
        } catch (...) {  // nothing is registered yet
            end_leases();
            throw;
        }
        running_ = true;
    }
    call->released = false;
    incoming_.push_back(call);
    registered_.push_back(call.get());
    released_cv_.notify_all();  // a closer waiting for the thread to leave: it stays now
}

bool Engine::all_cancelled() const {
    return !registered_.empty() &&
           std::all_of(registered_.begin(), registered_.end(), [](const CallState * c) { return c->cancelled.load(); });
}

bool Engine::abort_wanted() const {
    return (prefilling_ != nullptr && prefilling_->cancelled.load()) || all_cancelled();
}

void Engine::on_cancel(CallState & call) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (call.released) return;  // over: its token must not reach a decode of another call
    if (all_cancelled()) {
        core_->tgt->request_abort();
        if (core_->dft) core_->dft->request_abort();
    } else if (prefilling_ == &call) {
        // its own prompt chunk, on the target only: the drafter's part of that chunk may decode
        // other sequences' deferred rows (patch 0005), which must not be cut short
        core_->tgt->request_abort();
    }
    // otherwise the others go on and it leaves at the end of the iteration
}

void Engine::wait_released(CallState & call) {
    std::unique_lock<std::mutex> lock(mutex_);
    // the last call out also waits for the thread to leave, so that a closed call leaves no thread
    // behind (and a session's threads are countable)
    released_cv_.wait(lock, [this, &call] { return call.released && (!registered_.empty() || !running_); });
    if (!running_ && worker_.joinable()) worker_.join();  // it has left its loop: only returning is left
}

void Engine::seq_rm(llama_seq_id seq, llama_pos p0) {
    if (!llama_memory_seq_rm(llama_get_memory(core_->tgt->get()), seq, p0, -1) || fault_fires(Fault::SeqRmFails)) {
        throw rollback_error(seq, p0, "target's cache");
    }
    if (core_->dft && !llama_memory_seq_rm(llama_get_memory(core_->dft->get()), seq, p0, -1)) {
        throw rollback_error(seq, p0, "draft cache");
    }
}

void Engine::retire(SeqState & s, const char * reason) {
    CallState & c = s.c();
    c.close_window();
    const Clock::time_point now = Clock::now();
    // the session's wall times: the union of the calls' spans (total) and generation windows
    if (s.generating && --n_generating_ == 0) shared_.window_s += seconds(t_gen_last_ - t_gen_first_);
    if (--n_live_ == 0) shared_.total_us += std::chrono::duration<double, std::micro>(now - t_busy_).count();
    s.delta.total_us += std::chrono::duration<double, std::micro>(now - c.t_start).count();
    if (c.stats.tokens > 1) {
        s.delta.rate_tokens += (uint64_t) c.stats.tokens - 1;
        s.delta.window_s += c.stats.generation_s;
    }
    // waits for a reader's copy (microseconds) so that stats read after Done include this call
    core_->stats->fold(c.seq, s.delta, shared_, true);
    keep_cache(s, reason);
    if (reason != nullptr) {
        c.finish(reason, {{"iterations", (double) s.figures.iterations},
                          {"drafts_generated", (double) s.figures.drafts_generated},
                          {"drafts_accepted", (double) s.figures.drafts_accepted},
                          {"seq", (double) c.seq}});
    }
    s.retired = true;
    std::lock_guard<std::mutex> lock(mutex_);
    registered_.erase(std::find(registered_.begin(), registered_.end(), &c));
    c.released = true;  // from here on the handle may close
    released_cv_.notify_all();
}

void Engine::keep_cache(SeqState & s, const char * reason) {
    const llama_seq_id seq = s.c().seq;
    // What the memory holds is known after a finished call (the prompt and what it generated) and,
    // on attention-only memory, after a cancel (an aborted decode leaves no rows behind). A cancel on
    // a recurrent state, or with a drafter's context (an aborted catch-up), or a failure: start over.
    if (!s.begun) return;  // nothing of this call reached the memory: it holds what it held
    const bool finished = reason != nullptr && std::string(reason) != "cancelled";
    const bool known = finished || (reason != nullptr && !cache_.recurrent() && !core_->dft);
    try {
        if (!known) {
            cache_.clear(seq);  // a refusal is the next call's: its reuse clears again, and raises
        } else if (s.prompt_tgt.empty()) {  // it ended inside its prompt
            cache_.keep(seq, llama_tokens(s.c().req.prompt.begin(), s.c().req.prompt.begin() + s.n_prefilled));
        } else {
            cache_.keep(seq, s.prompt_tgt);
        }
    } catch (...) {  // nothing is thrown here today; the next call starts afresh all the same
        cache_.forget(seq);
    }
}

void Engine::fail(SeqState & s, const Error & e) {
    if (s.retired) return;  // it failed while retiring: its handle already has its last event
    s.emitter.abandon();
    s.c().fail(e);
    retire(s, nullptr);
}

// ---------------------------------------------------------------------------------------------------
// the loop

void Engine::loop() {
    std::vector<std::unique_ptr<SeqState>> seqs;
    try {
        run_loop(seqs);
    } catch (...) {
        // not expected (errors are per call or per pass, handled inside); never leave a caller waiting
        const Error err = current_error();
        for (auto & s : seqs) {
            if (!s || s->retired) continue;
            try {
                fail(*s, err);
            } catch (...) {  // retire's own work failed: release the call all the same
                std::lock_guard<std::mutex> lock(mutex_);
                if (!s->c().released) {
                    registered_.erase(std::find(registered_.begin(), registered_.end(), &s->c()));
                    s->c().released = true;
                }
            }
        }
        std::lock_guard<std::mutex> lock(mutex_);
        for (const auto & c : incoming_) {
            c->fail(err);
            registered_.erase(std::find(registered_.begin(), registered_.end(), c.get()));
            c->released = true;
        }
        incoming_.clear();
        // the ones it picked up and lost track of: release them too (their Done will not come)
        for (CallState * c : registered_) {
            c->fail(err);
            c->released = true;
        }
        registered_.clear();
        leave();
    }
}

void Engine::run_loop(std::vector<std::unique_ptr<SeqState>> & seqs) {
    const llama_vocab * vocab = core_->tgt->model()->vocab();
    const size_t n_draft = (size_t) core_->config.n_draft, n_stages = core_->stage_types.size();
    std::vector<SeqState *> ready;
    while (true) {
        {
            std::lock_guard<std::mutex> lock(mutex_);
            seqs.reserve(seqs.size() + incoming_.size());  // so that the pick-up below cannot throw halfway
            for (const auto & c : incoming_) {
                seqs.push_back(std::make_unique<SeqState>(c, vocab, n_draft, n_stages));
                if (n_live_++ == 0) t_busy_ = c->t_start;
            }
            incoming_.clear();
            if (seqs.empty()) {
                leave();
                return;
            }
            // an abort asked for a pass that is over (or that only served cancelled calls)
            if (!abort_wanted()) clear_aborts();
        }
        // prompts: one n_batch chunk of each new call per iteration, so a long prompt does not
        // stall the calls that are generating
        if (fault_fires(Fault::ThrowUnknown)) throw 42;  // tests: what no llama.cpp call should ever do
        ready.clear();
        for (auto & s : seqs) {
            if (s->c().cancelled.load()) continue;  // retired below
            if (s->id_last < 0) {
                try {
                    prefill_chunk(*s);
                } catch (...) {
                    fail(*s, current_error());
                }
                if (s->retired) {  // failed, or (plain) its first token ended it
                    s.reset();
                    continue;
                }
            }
            if (s->id_last >= 0 && !s->c().cancelled.load()) ready.push_back(s.get());  // joins this pass
        }
        seqs.erase(std::remove(seqs.begin(), seqs.end(), nullptr), seqs.end());
        if (!ready.empty()) iterate(ready);
        // cancelled calls leave here (also those that were waiting for their prompt)
        for (auto & s : seqs) {
            if (s->retired) {  // finished inside iterate
                s.reset();
            } else if (s->c().cancelled.load()) {
                s->emitter.abandon();
                retire(*s, "cancelled");
                s.reset();
            }
        }
        seqs.erase(std::remove(seqs.begin(), seqs.end(), nullptr), seqs.end());
    }
}

const char * Engine::emit_tokens(SeqState & s, const std::vector<llama_token> & ids, std::vector<TokenProbs> & probs,
                                 size_t n_drafted) {
    CallState & c = s.c();
    const llama_vocab * vocab = core_->tgt->model()->vocab();
    const int32_t before = c.stats.tokens;
    const char * reason = nullptr;
    for (size_t i = 0; i < ids.size(); ++i) {
        const llama_token id = ids[i];
        if (s.id_last >= 0) s.prompt_tgt.push_back(s.id_last);  // decoded by the pass that sampled `id`
        s.id_last = id;
        // ids: the accepted drafts, then the target's own token
        const Origin origin = n_drafted == 0 ? Origin::Plain : i + 1 < ids.size() ? Origin::Draft : Origin::Target;
        reason = c.emit(s.emitter, vocab, id, i < probs.size() ? std::optional<TokenProbs>(std::move(probs[i])) : std::nullopt,
                        origin, origin == Origin::Target ? (int32_t) n_drafted : 0);
        if (c.stats.tokens > before && !s.generating) {
            s.generating = true;
            if (n_generating_++ == 0) t_gen_first_ = c.t_first;
        }
        if (reason) break;
    }
    if (c.stats.tokens > before) t_gen_last_ = std::max(t_gen_last_, c.t_last);
    s.delta.tokens_emitted += (uint64_t) (c.stats.tokens - before);
    return reason;
}

void Engine::prefill_chunk(SeqState & s) {
    CallState & c = s.c();
    llama_context * ctx_tgt = core_->tgt->get();
    common_speculative * spec = core_->spec.get();
    const llama_seq_id seq = c.seq;
    const std::vector<llama_token> & prompt = c.req.prompt;
    // The whole prompt, each chunk fed to the drafter, and the first token sampled from its last row
    // (no decode of its own), except where the memory is checkpointed (a recurrent model, or MTP and
    // EAGLE-3, whose carried row is part of a checkpoint): there the last prompt token is held back
    // for the first pass (the first verify's [id_last], or a plain step), so that the prompt cache's
    // checkpoint before it serves the same prompt again (ADR 0018).
    const bool hold_last = cache_.checkpointed();
    const int32_t n_prefix = (int32_t) prompt.size() - (hold_last ? 1 : 0);
    const Clock::time_point t0 = Clock::now();
    auto progress = [&](int32_t processed) {
        if (!c.req.prompt_progress) return;
        Event ev{Event::PromptProgress, -1, {}, c.stats, std::nullopt};
        ev.stats.prompt_tokens = (int32_t) prompt.size();
        ev.processed = processed;
        c.queue.push(std::move(ev));
    };
    if (!s.begun) {
        // the prompt cache: the longest prefix this sequence's memory still holds is not decoded again
        s.begun = true;
        s.n_prefilled = cache_.reuse(seq, prompt, c.req.cache_prompt);
        c.stats.cached_tokens = s.n_prefilled;
        s.delta.cached_tokens += (uint64_t) s.n_prefilled;
        progress(s.n_prefilled);
    }
    int32_t i_last = -1;  // not held back: the row of the last prompt token in this chunk
    const bool all_cached = s.n_prefilled >= n_prefix;  // nothing left to decode (hold_last only)
    if (s.n_prefilled < n_prefix) {
        const int32_t n_batch = (int32_t) std::max<uint32_t>(1, llama_n_batch(ctx_tgt));
        const int32_t end = std::min(n_prefix, s.n_prefilled + n_batch);
        common_batch batch(ctx_tgt);
        for (int32_t i = s.n_prefilled; i < end; ++i) batch.add(prompt[i], i, seq, !hold_last && i == n_prefix - 1);
        if (!hold_last && end == n_prefix) i_last = end - 1 - s.n_prefilled;
        // while this chunk decodes, a cancel of this call may abort it (and nothing else)
        struct Prefilling {
            Engine & e;
            Prefilling(Engine & engine, CallState & call) : e(engine) {
                std::lock_guard<std::mutex> lock(e.mutex_);
                e.prefilling_ = &call;
                if (call.cancelled.load()) e.core_->tgt->request_abort();  // cancelled just now: this chunk is its own
            }
            ~Prefilling() {  // also when the decode throws
                std::lock_guard<std::mutex> lock(e.mutex_);
                e.prefilling_ = nullptr;
                if (!e.abort_wanted()) e.clear_aborts();  // an abort meant for this chunk must not reach the next pass
            }
        };
        int rc = 0;
        bool ok = false;
        {
            Prefilling guard(*this, c);
            rc = llama_process(ctx_tgt, LLAMA_PROCESS_TYPE_DECODE, batch.get());
            ok = rc == 0 && (!spec || common_speculative_process(spec, batch));
        }
        c.stats.prefill_s += seconds(Clock::now() - t0);
        check_backends(*core_);  // before the return code: a failed worker makes that -3 too
        if (!decode_ok(rc, "prompt decode") || c.cancelled.load()) {
            return;  // an abort only ever stops a cancelled call: it leaves as such
        }
        if (!ok) throw drafter_error(*core_, "the prompt");
        s.n_prefilled = end;
        if (end < n_prefix) cache_.checkpoint(seq, end, /*periodic=*/true);  // inside a long prompt
        // hold_last: the last prompt token goes with the first pass; it counts as processed here
        progress(end == n_prefix ? (int32_t) prompt.size() : end);
    }
    const double us = us_since(t0);
    s.delta.prefill_us += us;
    shared_.prefill_us += us;
    if (s.n_prefilled < n_prefix) return;  // more chunks next iteration
    if (all_cached) progress((int32_t) prompt.size());  // the first pass decodes the last token
    cache_.checkpoint(seq, n_prefix);  // a later prompt that diverges after this point restarts here
    for (llama_token t : prompt) common_sampler_accept(c.smpl.get(), t, false);
    s.prompt_tgt.assign(prompt.begin(), prompt.begin() + n_prefix);
    s.prompt_tgt.reserve(core_->tgt->n_ctx());
    if (spec) common_speculative_begin(spec, seq, s.prompt_tgt);  // the drafter starts from what was decoded
    if (hold_last) {
        s.id_last = prompt.back();
        s.n_past = n_prefix;
        return;
    }
    // the first token, sampled from the prompt's last row; drafts come from the next pass on
    const Clock::time_point ts = Clock::now();
    std::vector<TokenProbs> probs;
    const std::vector<llama_token> ids = sample_and_accept(c, ctx_tgt, {i_last}, {}, probs);
    const double sample_us = us_since(ts);
    s.delta.sample_us += sample_us;
    shared_.sample_us += sample_us;
    s.n_past = n_prefix;
    if (const char * reason = emit_tokens(s, ids, probs, 0)) retire(s, reason);
}

void Engine::iterate(std::vector<SeqState *> & ready) {
    Core & core = *core_;
    llama_context * ctx_tgt = core.tgt->get();
    llama_context * ctx_dft = core.dft ? core.dft->get() : nullptr;
    common_speculative * spec = core.spec.get();
    const int32_t n_draft = core.config.n_draft;
    const int32_t n_ctx = (int32_t) core.tgt->n_ctx();
    const size_t n_stages = core.stage_types.size();
    DraftLengthPolicy * policy = core.policy.get();

    // draft for every sequence in one call: never more than the tokens still wanted after the one
    // the verify yields anyway
    Clock::time_point t0 = Clock::now();
    // n_draft="auto": the policy chooses every sequence's length for this step at once (a verify's
    // cost depends on how many rows share it); the first pass of a call (below) is not its choice
    if (policy) {
        policy_seqs_.clear();
        for (SeqState * s : ready) {
            if (s->generating) policy_seqs_.push_back(s->c().seq);
        }
        policy->choose(policy_seqs_, policy_lengths_);
    }
    size_t i_policy = 0;
    bool any_draft = false;
    for (SeqState * s : ready) {
        CallState & c = s->c();
        const int32_t remaining = c.req.max_tokens - c.stats.tokens;
        // the first pass after a checkpointed prompt (its held-back last token) drafts nothing: the
        // first token comes out after the prompt alone, as in plain decoding, and the drafter's
        // catch-up on the prompt waits for the second pass
        const bool first = !s->generating;
        int32_t wanted = first ? 0 : policy ? policy_lengths_[i_policy++] : n_draft;
        if (c.req.draft_max >= 0) wanted = std::min(wanted, c.req.draft_max);  // the call's own cap
        const int32_t room = std::min(remaining - 1, n_ctx - (int32_t) s->n_past - 2);
        s->n_max = std::max(0, std::min(wanted, room));
        // a shadow draft (n_draft="auto", plain step): drafted, compared with what the plain step
        // samples, never verified
        s->shadow = policy && !first && c.req.draft_max != 0 && s->n_max == 0 && policy->shadow(c.seq) &&
                    policy->shadow_length() <= std::min(room, c.req.draft_max < 0 ? room : c.req.draft_max);
        const int32_t n_ask = s->shadow ? policy->shadow_length() : s->n_max;
        ++s->delta.draft_length_histogram[(size_t) s->n_max];
        s->draft.clear();
        s->shadow_draft.clear();
        s->stage = -1;
        if (n_ask > 0) {
            common_speculative_draft_params & dp = common_speculative_get_draft_params(spec, c.seq);
            dp = {
                /* .drafting = */ true,
                /* .n_max    = */ n_ask,
                /* .pos0     = */ s->n_past,
                /* .id_last  = */ s->id_last,
                /* .prompt   = */ &s->prompt_tgt,
                /* .result   = */ &s->draft,
            };
            dp.p_min = c.req.p_min;  // the call's own threshold, or -1: the session's (patch 0007)
            any_draft = true;
        }
    }
    stage_time_.clear();
    SpecCounters & stage_time = stage_time_;
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
            const common_speculative_type t = common_speculative_get_last_type(spec, s->c().seq);
            for (size_t i = 0; i < n_stages; ++i) {
                if (core.stage_types[i] == t) s->stage = (int) i;
            }
        }
        // the draft context must not run ahead of the target's positions
        if (ctx_dft) {
            const llama_seq_id seq = s->c().seq;
            const llama_pos p0 = llama_memory_seq_pos_max(llama_get_memory(ctx_tgt), seq) + 1;
            if (!llama_memory_seq_rm(llama_get_memory(ctx_dft), seq, p0, -1)) {
                // never go on with a draft cache that is ahead of the target: this call fails
                fail(*s, rollback_error(seq, p0, "draft cache"));
            }
        }
    }
    ready.erase(std::remove_if(ready.begin(), ready.end(), [](const SeqState * s) { return s->retired; }), ready.end());
    if (ready.empty()) return;
    const double draft_us = us_since(t0);
    shared_.draft_us += draft_us;
    for (size_t i = 0; i < n_stages; ++i) shared_.stages[i].draft_us += stage_time.stages[i].draft_us;
    for (SeqState * s : ready) {
        if (s->n_max > 0 || s->shadow) {
            s->delta.draft_us += draft_us;
            for (size_t i = 0; i < n_stages; ++i) s->delta.stages[i].draft_us += stage_time.stages[i].draft_us;
        }
    }

    // what the policy is told of the step as a whole: the rows asked for, the longest draft made,
    // and how many sequences shared the drafter's time for their shadow drafts
    int32_t rows_asked = 0, k_max = 0, n_shadows = 0;
    const size_t n_verified = ready.size();
    for (SeqState * s : ready) {
        rows_asked += 1 + s->n_max;
        k_max = std::max(k_max, s->n_max);
        n_shadows += s->shadow ? 1 : 0;
    }

    // verify every sequence's [id_last, draft...] in one target pass, all rows with logits
    t0 = Clock::now();
    const Clock::time_point t_rest = t0;
    if (!verify_batch_) verify_batch_ = std::make_unique<common_batch>(ctx_tgt);
    common_batch & batch = *verify_batch_;
    batch.clear();
    for (SeqState * s : ready) {
        const llama_seq_id seq = s->c().seq;
        s->i_batch = batch.size();
        batch.add(s->id_last, s->n_past, seq, true);
        for (size_t i = 0; i < s->draft.size(); ++i) batch.add(s->draft[i], s->n_past + 1 + (llama_pos) i, seq, true);
    }
    const int rc = llama_process(ctx_tgt, LLAMA_PROCESS_TYPE_DECODE, batch.get());
    try {
        check_backends(core);  // before the return code: a failed worker makes that -3 too
    } catch (...) {
        const Error e = current_error();
        for (SeqState * s : ready) fail(*s, e);
        return;
    }
    if (rc == 2) return;  // aborted: every sequence was cancelled; they leave as such
    if (rc != 0) {
        const Error e = Error::with_code(ErrorKind::Decode, "verify decode failed: llama_decode returned " + std::to_string(rc), rc);
        for (SeqState * s : ready) fail(*s, e);
        return;
    }
    if (spec && !common_speculative_process(spec, batch)) {
        bool all_cancelled = true;
        for (SeqState * s : ready) all_cancelled = all_cancelled && s->c().cancelled.load();
        if (all_cancelled) return;  // the abort reached the draft context's catch-up decode
        Error e = drafter_error(core, "the verify batch");
        try {
            check_backends(core);  // the drafter's context on a failed RPC worker: say so
        } catch (...) {
            e = current_error();
        }
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
    std::vector<TokenProbs> probs;
    for (SeqState * s : ready) {
        try {
            CallState & c = s->c();
            const llama_seq_id seq = c.seq;
            SpecCounters & delta = s->delta;
            delta.verify_us += verify_us;
            ++delta.passes;
            const Clock::time_point ts = Clock::now();
            idxs.resize(s->draft.size() + 1);
            for (size_t i = 0; i < idxs.size(); ++i) idxs[i] = s->i_batch + (int) i;
            const std::vector<llama_token> ids = sample_and_accept(c, ctx_tgt, idxs, s->draft, probs);
            const double us = us_since(ts);
            delta.sample_us += us;
            sample_us += us;
            const size_t n_acc = ids.size() - 1;
            // a shadow draft that matched is reported as accepted: the drafter's own bookkeeping (n-gram
            // statistics, low-acceptance resets) then sees what really happened; hidden-state drafters
            // clamp to the rows verified, here the one row of the plain step
            const bool shadow_hit = !s->shadow_draft.empty() && s->shadow_draft[0] == ids[0];
            if (spec) common_speculative_accept(spec, seq, (uint16_t) (shadow_hit ? 1 : n_acc));
            if (s->shadow) {
                ++delta.shadow_drafts;
                delta.shadow_accepted += shadow_hit ? 1 : 0;
            }

            ++delta.iterations;
            ++s->figures.iterations;
            delta.drafts_generated += s->draft.size();
            s->figures.drafts_generated += s->draft.size();
            delta.drafts_accepted += n_acc;
            s->figures.drafts_accepted += n_acc;
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
            if (const char * reason = emit_tokens(*s, ids, probs, s->draft.size())) {
                retire(*s, reason);
                continue;
            }
            // drop the rejected positions from both caches (plain steps have none); a failed
            // rollback ends the call before anything is sampled from a wrong cache
            if (spec) seq_rm(seq, s->n_past);
            if (policy) {
                if (s->shadow) {
                    policy->observe_shadow(seq, !s->shadow_draft.empty(), shadow_hit, k_max > 0 ? -1.0 : draft_us / n_shadows);
                }
                policy->observe_draft(seq, s->n_max, (int32_t) s->draft.size(), (int32_t) n_acc);
            }
        } catch (...) {  // one call's failure (a grammar that cannot go on, a failed rollback, ...) ends that call only
            fail(*s, current_error());
        }
    }
    shared_.sample_us += sample_us;
    // the step's cost, by the rows it verified (a step with only shadow drafts, k_max 0, is timed as
    // a plain one: their drafting time is reported apart, above)
    if (policy) policy->observe_step(policy->rows((int32_t) n_verified, rows_asked, k_max), k_max, draft_us, us_since(t_rest));
    // publish; never waits for a reader
    for (SeqState * s : ready) {
        if (!s->retired) core.stats->fold(s->c().seq, s->delta, shared_, false);
    }
}

}  // namespace llamaspec
