// Speculative generation (MTP) through upstream common_speculative, and its Python binding.
#include "spec_session.h"

#include <nanobind/stl/shared_ptr.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include "dict_util.h"
#include "logging.h"

namespace nb = nanobind;

namespace llamaspec {

// ---------------------------------------------------------------------------------------------------
// counters

void SpecCounters::add(const SpecCounters & o) {
    iterations += o.iterations;
    drafts_generated += o.drafts_generated;
    drafts_accepted += o.drafts_accepted;
    tokens_emitted += o.tokens_emitted;
    rate_tokens += o.rate_tokens;
    window_s += o.window_s;
    draft_us += o.draft_us;
    verify_us += o.verify_us;
    sample_us += o.sample_us;
    prefill_us += o.prefill_us;
    total_us += o.total_us;
    for (size_t i = 0; i < drafted_per_position.size() && i < o.drafted_per_position.size(); ++i) {
        drafted_per_position[i] += o.drafted_per_position[i];
        accepted_per_position[i] += o.accepted_per_position[i];
    }
}

void SpecCounters::clear() {
    SpecCounters fresh(drafted_per_position.size());
    *this = std::move(fresh);
}

bool SpecStatsBox::try_fold(SpecCounters & delta) {
    std::unique_lock<std::mutex> lock(mutex_, std::try_to_lock);
    if (!lock.owns_lock()) return false;
    totals_.add(delta);
    delta.clear();
    return true;
}

void SpecStatsBox::fold(SpecCounters & delta) {
    std::lock_guard<std::mutex> lock(mutex_);
    totals_.add(delta);
    delta.clear();
}

SpecCounters SpecStatsBox::snapshot() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return totals_;
}

void SpecStatsBox::reset() {
    std::lock_guard<std::mutex> lock(mutex_);
    totals_.clear();
}

// ---------------------------------------------------------------------------------------------------
// session

std::shared_ptr<SpecSession> SpecSession::create_mtp(std::shared_ptr<Model> model, llama_context_params params,
                                                     int32_t n_draft) {
    if (n_draft < 1) throw Error(ErrorKind::InvalidOption, "n_draft must be >= 1");
    auto core = std::make_shared<SpecCore>((size_t) n_draft);
    core->n_draft = n_draft;
    core->methods = {"draft-mtp"};

    // target: keep n_draft recurrent-state snapshots per sequence (rollback of rejected drafts on
    // hybrid models) and room for 1 + n_draft output rows per verify
    const auto limits = common_speculative_get_output_limits((int32_t) params.n_batch, 1, n_draft);
    llama_context_params tp = params;
    tp.ctx_type = LLAMA_CONTEXT_TYPE_DEFAULT;
    tp.n_rs_seq = (uint32_t) n_draft;
    tp.n_outputs_max = (uint32_t) limits.total;
    tp.n_outputs_max_per_seq = (uint32_t) limits.per_seq;

    // the MTP draft context: same model, same size, built against the target, no snapshots
    llama_context_params dp = params;
    dp.ctx_type = LLAMA_CONTEXT_TYPE_MTP;
    dp.n_rs_seq = 0;

    // check the model before anything can abort (Context::create checks MTP layers for the draft)
    if (llama_model_n_layer_nextn(model->get()) <= 0 || !model->mtp_loaded()) {
        Context::create(model, dp);  // throws the precise UnsupportedModel error
    }
    core->tgt = Context::create(model, tp);
    dp.n_ctx = core->tgt->n_ctx();
    core->dft = Context::create(model, dp, core->tgt);

    common_params_speculative sp;
    sp.types = {COMMON_SPECULATIVE_TYPE_DRAFT_MTP};
    sp.draft.n_max = n_draft;
    sp.draft.n_min = 0;
    sp.draft.ctx_tgt = core->tgt->get();
    sp.draft.ctx_dft = core->dft->get();
    {
        LogCapture capture;
        // must run before the first target decode: it switches on the target's hidden-row output
        common_speculative * spec = common_speculative_init(sp, 1);
        if (spec == nullptr) {
            throw Error(ErrorKind::Generic, "common_speculative_init failed for MTP: " + capture.summary());
        }
        core->spec.reset(spec);
    }
    auto s = std::shared_ptr<SpecSession>(new SpecSession());
    s->core_ = std::move(core);
    return s;
}

std::shared_ptr<Run> SpecSession::start(GenRequest req) {
    return start_run<SpecRun>(*core_->tgt, busy_, std::move(req), "session", core_);
}

// ---------------------------------------------------------------------------------------------------
// the speculative loop

SpecRun::SpecRun(std::shared_ptr<SpecCore> core, std::shared_ptr<std::atomic<bool>> busy, GenRequest req,
                 common_sampler_ptr smpl)
    : Run(core->tgt, std::move(busy), std::move(req), std::move(smpl)), core_(std::move(core)) {}

void SpecRun::cancel() {
    Run::cancel();
    core_->dft->request_abort();
}

namespace {
double us_since(Clock::time_point t) { return std::chrono::duration<double, std::micro>(Clock::now() - t).count(); }
}  // namespace

void SpecRun::work() {
    SpecCore & core = *core_;
    llama_context * ctx_tgt = core.tgt->get();
    llama_context * ctx_dft = core.dft->get();
    common_speculative * spec = core.spec.get();
    const llama_vocab * vocab = core.tgt->model()->vocab();
    const llama_seq_id seq = 0;
    GenStats & stats = stats_;
    TokenEmitter emitter(vocab, queue_, req_.stop);
    SpecCounters delta(core.n_draft);  // folded into the session's stats as we go
    SpecCounters call(core.n_draft);   // this call's figures, for Done
    core.dft->clear_abort();

    auto done = [&](const char * reason) {
        delta.total_us += us_since(t_start_);
        if (stats.tokens > 1) {
            delta.rate_tokens += stats.tokens - 1;
            delta.window_s += stats.generation_s;
        }
        core.stats.fold(delta);
        finish(stats, reason,
               {{"iterations", (double) call.iterations},
                {"drafts_generated", (double) call.drafts_generated},
                {"drafts_accepted", (double) call.drafts_accepted}});
    };

    // a fresh start for every call: both caches and the recurrent state
    core.tgt->clear_memory();
    core.dft->clear_memory();

    // prefill: every prompt token but the last, in n_batch chunks, each fed to the drafter
    const Clock::time_point t_prefill = Clock::now();
    const std::vector<llama_token> & prompt = req_.prompt;
    const int32_t n_prefix = (int32_t) prompt.size() - 1;
    const int32_t n_batch = (int32_t) std::max<uint32_t>(1, llama_n_batch(ctx_tgt));
    common_batch batch(ctx_tgt);
    for (int32_t start = 0; start < n_prefix; start += n_batch) {
        batch.clear();
        for (int32_t i = start; i < std::min(n_prefix, start + n_batch); ++i) {
            batch.add(prompt[i], i, seq, false);
        }
        if (!decode_ok(llama_process(ctx_tgt, LLAMA_PROCESS_TYPE_DECODE, batch.get()), "prompt decode") ||
            cancelled()) {
            stats.prefill_s = seconds(Clock::now() - t_prefill);
            done("cancelled");
            return;
        }
        if (!common_speculative_process(spec, batch)) {
            if (cancelled()) {  // the abort reached the draft context's catch-up decode
                stats.prefill_s = seconds(Clock::now() - t_prefill);
                done("cancelled");
                return;
            }
            throw Error(ErrorKind::Generic, "the MTP drafter failed to process the prompt");
        }
    }
    for (llama_token t : prompt) common_sampler_accept(smpl_.get(), t, false);
    stats.prefill_s = seconds(Clock::now() - t_prefill);
    delta.prefill_us += stats.prefill_s * 1e6;

    llama_tokens prompt_tgt(prompt.begin(), prompt.end() - 1);
    prompt_tgt.reserve(core.tgt->n_ctx());
    llama_token id_last = prompt.back();
    llama_pos n_past = n_prefix;
    common_speculative_begin(spec, seq, prompt_tgt);

    llama_tokens draft;
    const int32_t n_ctx = (int32_t) core.tgt->n_ctx();
    const char * reason = "length";
    bool finished = false;
    while (!finished) {
        if (cancelled()) {
            emitter.abandon();
            reason = "cancelled";
            break;
        }
        // draft: never more than the tokens still wanted after the one the verify yields anyway
        const int32_t remaining = req_.max_tokens - stats.tokens;
        const int32_t n_max = std::max(0, std::min({core.n_draft, remaining - 1, n_ctx - (int32_t) n_past - 2}));
        Clock::time_point t0 = Clock::now();
        draft.clear();
        common_speculative_get_draft_params(spec, seq) = {
            /* .drafting = */ true,
            /* .n_max    = */ n_max,
            /* .pos0     = */ n_past,
            /* .id_last  = */ id_last,
            /* .prompt   = */ &prompt_tgt,
            /* .result   = */ &draft,
        };
        common_speculative_draft(spec);
        if ((int32_t) draft.size() > n_max) draft.resize(n_max);
        // the draft context must not run ahead of the target's positions
        llama_memory_seq_rm(llama_get_memory(ctx_dft), seq, llama_memory_seq_pos_max(llama_get_memory(ctx_tgt), seq) + 1, -1);
        delta.draft_us += us_since(t0);

        // verify [id_last, draft...] on the target, all rows with logits
        t0 = Clock::now();
        batch.clear();
        batch.add(id_last, n_past++, seq, true);
        for (size_t i = 0; i < draft.size(); ++i) {
            batch.add(draft[i], n_past + (llama_pos) i, seq, true);
        }
        if (!decode_ok(llama_process(ctx_tgt, LLAMA_PROCESS_TYPE_DECODE, batch.get()), "verify decode")) {
            emitter.abandon();
            reason = "cancelled";
            break;
        }
        if (!common_speculative_process(spec, batch)) {
            emitter.abandon();
            if (cancelled()) {
                reason = "cancelled";
                break;
            }
            throw Error(ErrorKind::Generic, "the MTP drafter failed to process the verify batch");
        }
        delta.verify_us += us_since(t0);

        // sample every row with the target's sampler: one draw per emitted token, as plain decoding
        t0 = Clock::now();
        const std::vector<llama_token> ids = common_sampler_sample_and_accept_n(smpl_.get(), ctx_tgt, draft);
        delta.sample_us += us_since(t0);
        const size_t n_acc = ids.size() - 1;
        common_speculative_accept(spec, seq, (uint16_t) n_acc);

        ++delta.iterations;
        ++call.iterations;
        delta.drafts_generated += draft.size();
        call.drafts_generated += draft.size();
        delta.drafts_accepted += n_acc;
        call.drafts_accepted += n_acc;
        for (size_t i = 0; i < draft.size() && i < delta.drafted_per_position.size(); ++i) {
            ++delta.drafted_per_position[i];
            if (i < n_acc) ++delta.accepted_per_position[i];
        }
        n_past += (llama_pos) n_acc;

        // emit, exactly up to max_tokens, an end-of-generation token or a stop string
        const int32_t before = stats.tokens;
        for (llama_token id : ids) {
            prompt_tgt.push_back(id_last);
            id_last = id;
            if (const char * r = emit(emitter, id)) {
                reason = r;
                finished = true;
                break;
            }
        }
        delta.tokens_emitted += (uint64_t) (stats.tokens - before);
        if (finished) break;

        // drop the rejected positions from both caches
        llama_memory_seq_rm(llama_get_memory(ctx_tgt), seq, n_past, -1);
        llama_memory_seq_rm(llama_get_memory(ctx_dft), seq, n_past, -1);
        core.stats.try_fold(delta);  // publish; never waits for a reader
    }
    close_window();
    done(reason);
}

// ---------------------------------------------------------------------------------------------------
// bindings

static nb::typed<nb::dict, nb::str, nb::any> counters_to_dict(const SpecCounters & c, int32_t n_draft) {
    nb::typed<nb::dict, nb::str, nb::any> d;
    d["iterations"] = c.iterations;
    d["drafts_generated"] = c.drafts_generated;
    d["drafts_accepted"] = c.drafts_accepted;
    d["tokens_emitted"] = c.tokens_emitted;
    d["rate_tokens"] = c.rate_tokens;
    d["window_s"] = c.window_s;
    d["draft_us"] = c.draft_us;
    d["verify_us"] = c.verify_us;
    d["sample_us"] = c.sample_us;
    d["prefill_us"] = c.prefill_us;
    d["total_us"] = c.total_us;
    d["n_draft"] = n_draft;
    d["drafted_per_position"] = nb::cast(c.drafted_per_position);
    d["accepted_per_position"] = nb::cast(c.accepted_per_position);
    return d;
}

void register_speculative(nb::module_ & m) {
    nb::class_<SpecSession>(m, "SpecSession", "Speculative decoding engine (native core; use llamaspec.MTP).")
        .def_static(
            "create_mtp",
            [](std::shared_ptr<Model> model, nb::typed<nb::dict, nb::str, nb::any> options, int32_t n_draft) {
                llama_context_params p = context_params_from_dict(options);
                nb::gil_scoped_release nogil;
                return SpecSession::create_mtp(std::move(model), p, n_draft);
            },
            nb::arg("model"), nb::arg("options"), nb::arg("n_draft"),
            "Build the target + MTP contexts and the speculative state (releases the GIL).")
        .def_prop_ro("target", [](const SpecSession & s) { return s.core()->tgt; })
        .def_prop_ro("draft", [](const SpecSession & s) { return s.core()->dft; })
        .def_prop_ro("n_draft", [](const SpecSession & s) { return s.core()->n_draft; })
        .def_prop_ro("methods", [](const SpecSession & s) { return s.core()->methods; })
        .def_prop_ro("busy", &SpecSession::busy)
        .def("stats", [](const SpecSession & s) { return counters_to_dict(s.core()->stats.snapshot(), s.core()->n_draft); },
             "A consistent snapshot of the cumulative counters (never waits for the generation).")
        .def("reset_stats", [](SpecSession & s) { s.core()->stats.reset(); })
        .def("start",
             [](SpecSession & s, std::vector<llama_token> prompt, int32_t max_tokens, std::vector<std::string> stop,
                nb::typed<nb::dict, nb::str, nb::any> sampling, std::string grammar_root) {
                 GenRequest req = make_request(std::move(prompt), max_tokens, std::move(stop), sampling,
                                               std::move(grammar_root));
                 nb::gil_scoped_release nogil;
                 return s.start(std::move(req));
             },
             nb::arg("prompt"), nb::arg("max_tokens"), nb::arg("stop"), nb::arg("sampling"), nb::arg("grammar_root"),
             "Start a speculative generation on a worker thread; returns its Run (releases the GIL).");
}

}  // namespace llamaspec
