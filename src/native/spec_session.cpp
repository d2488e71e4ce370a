// Speculative generation through upstream common_speculative (every drafter, chained), and its Python binding.
#include "spec_session.h"

#include <nanobind/stl/shared_ptr.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <algorithm>
#include <cstring>
#include <fstream>

#include "dict_util.h"
#include "logging.h"
#include "ngram-cache.h"  // common
#include "ggml-cpp.h"
#include "gguf.h"

namespace nb = nanobind;

namespace llamaspec {

// ---------------------------------------------------------------------------------------------------
// counters

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
    iterations += o.iterations;
    drafts_generated += o.drafts_generated;
    drafts_accepted += o.drafts_accepted;
    tokens_emitted += o.tokens_emitted;
    shadow_drafts += o.shadow_drafts;
    shadow_accepted += o.shadow_accepted;
    rate_tokens += o.rate_tokens;
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
    passes += o.passes;
    window_s += o.window_s;
    draft_us += o.draft_us;
    verify_us += o.verify_us;
    sample_us += o.sample_us;
    prefill_us += o.prefill_us;
    total_us += o.total_us;
    for (size_t i = 0; i < stages.size() && i < o.stages.size(); ++i) stages[i].draft_us += o.stages[i].draft_us;
}

void SpecCounters::clear() {
    SpecCounters fresh(drafted_per_position.size(), stages.size());
    *this = std::move(fresh);
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

// ---------------------------------------------------------------------------------------------------
// checks made before upstream sees the configuration (upstream answers several of these with an abort)

namespace {

bool is_model_drafter(common_speculative_type t) {
    switch (t) {
        case COMMON_SPECULATIVE_TYPE_DRAFT_SIMPLE:
        case COMMON_SPECULATIVE_TYPE_DRAFT_EAGLE3:
        case COMMON_SPECULATIVE_TYPE_DRAFT_MTP:
        case COMMON_SPECULATIVE_TYPE_DRAFT_DFLASH:
        case COMMON_SPECULATIVE_TYPE_DRAFT_DSPARK:
            return true;
        default:
            return false;
    }
}

std::string model_arch(const Model & m) { return m.meta("general.architecture"); }

// DSpark is a DFlash file with a Markov head; upstream tells them apart by its tensor in the GGUF.
bool is_dspark_file(const Model & m) {
    const auto types = common_speculative_types_from_gguf(m.path());
    return types.size() == 1 && types[0] == COMMON_SPECULATIVE_TYPE_DRAFT_DSPARK;
}

// The same rules as upstream's common_speculative_are_compatible, but the first mismatch is named.
void check_vocab_compatible(const Model & tgt, const Model & dft) {
    const llama_vocab * vt = tgt.vocab();
    const llama_vocab * vd = dft.vocab();
    auto fail = [&](const std::string & why) {
        throw Error(ErrorKind::IncompatibleVocab,
                    "the draft model '" + dft.path() + "' cannot draft for '" + tgt.path() + "': " + why, 0, false,
                    dft.path());
    };
    if (llama_vocab_type(vt) != llama_vocab_type(vd)) {
        fail("the tokenizer types differ (" + std::to_string(llama_vocab_type(vd)) + " vs the target's " +
             std::to_string(llama_vocab_type(vt)) + ")");
    }
    if (llama_vocab_get_add_bos(vt) != llama_vocab_get_add_bos(vd) ||
        (llama_vocab_get_add_bos(vt) && llama_vocab_bos(vt) != llama_vocab_bos(vd))) {
        fail("the BOS token settings differ");
    }
    if (llama_vocab_get_add_eos(vt) != llama_vocab_get_add_eos(vd) ||
        (llama_vocab_get_add_eos(vt) && llama_vocab_eos(vt) != llama_vocab_eos(vd))) {
        fail("the EOS token settings differ");
    }
    const int nt = llama_vocab_n_tokens(vt), nd = llama_vocab_n_tokens(vd);
    if (std::abs(nt - nd) > 128) {
        fail("the vocabulary sizes differ by more than 128 (" + std::to_string(nd) + " vs the target's " +
             std::to_string(nt) + ")");
    }
    for (int i = 5; i < std::min(nt, nd); ++i) {  // upstream skips the first 5 (special) tokens
        if (std::strcmp(llama_vocab_get_text(vt, i), llama_vocab_get_text(vd, i)) != 0) {
            fail("token " + std::to_string(i) + " differs ('" + llama_vocab_get_text(vd, i) + "' vs the target's '" +
                 llama_vocab_get_text(vt, i) + "')");
        }
    }
}

// A drafter file must be of the architecture its method runs (upstream would assert or misbehave).
void check_drafter_arch(common_speculative_type t, const Model & dft) {
    const std::string arch = model_arch(dft);
    auto fail = [&](const std::string & why) {
        throw Error(ErrorKind::UnsupportedModel,
                    "'" + dft.path() + "' (architecture '" + arch + "') " + why, 0, false, dft.path());
    };
    switch (t) {
        case COMMON_SPECULATIVE_TYPE_DRAFT_SIMPLE:
            if (arch == "eagle3" || arch == "dflash") {
                fail("is a drafter head that reads the target's hidden states, not a standalone model; use method='" +
                     std::string(arch == "eagle3" ? "eagle3" : "dflash or dspark") + "'");
            }
            break;
        case COMMON_SPECULATIVE_TYPE_DRAFT_EAGLE3:
            if (arch != "eagle3") fail("is not an EAGLE-3 drafter (architecture 'eagle3' expected)");
            break;
        case COMMON_SPECULATIVE_TYPE_DRAFT_DFLASH:
            if (arch != "dflash") fail("is not a DFlash drafter (architecture 'dflash' expected)");
            break;
        case COMMON_SPECULATIVE_TYPE_DRAFT_DSPARK:
            if (arch != "dflash" || !is_dspark_file(dft)) {
                fail("is not a DSpark drafter (architecture 'dflash' with a Markov head, markov_w1, expected)");
            }
            break;
        default:
            break;
    }
}

// A drafter head (EAGLE-3, DFlash, DSpark) reads the target's hidden states at given layers; a
// mismatch between the two files makes llama.cpp abort (GGML_ASSERT/GGML_ABORT) during init or at
// the first decode, so the contract is checked here from the drafter's GGUF metadata.
void check_drafter_head(common_speculative_type t, const Model & tgt, const Model & dft) {
    if (t != COMMON_SPECULATIVE_TYPE_DRAFT_EAGLE3 && t != COMMON_SPECULATIVE_TYPE_DRAFT_DFLASH &&
        t != COMMON_SPECULATIVE_TYPE_DRAFT_DSPARK) {
        return;
    }
    const std::string arch = model_arch(dft);
    auto fail = [&](const std::string & why) {
        throw Error(ErrorKind::UnsupportedModel,
                    "the drafter '" + dft.path() + "' does not fit the target '" + tgt.path() + "': " + why, 0, false,
                    dft.path());
    };
    gguf_init_params gp = {/* .no_alloc = */ true, /* .ctx = */ nullptr};
    gguf_context_ptr g(gguf_init_from_file(dft.path().c_str(), gp));
    if (!g) fail("its GGUF metadata cannot be read");
    const int32_t n_layer_tgt = llama_model_n_layer(tgt.get());
    const int32_t n_embd_tgt = llama_model_n_embd(tgt.get());
    const int32_t n_embd_dft = llama_model_n_embd(dft.get());
    auto u32_key = [&](const std::string & key, int64_t & out) {
        const int64_t id = gguf_find_key(g.get(), key.c_str());
        if (id < 0) return false;
        switch (gguf_get_kv_type(g.get(), id)) {
            case GGUF_TYPE_UINT32: out = gguf_get_val_u32(g.get(), id); return true;
            case GGUF_TYPE_INT32: out = gguf_get_val_i32(g.get(), id); return true;
            default: return false;
        }
    };

    // the target layers it reads (the loader has required the key and its length)
    std::vector<int64_t> layers;
    const int64_t id = gguf_find_key(g.get(), (arch + ".target_layers").c_str());
    if (id >= 0 && gguf_get_kv_type(g.get(), id) == GGUF_TYPE_ARRAY) {
        const size_t n = gguf_get_arr_n(g.get(), id);
        const enum gguf_type at = gguf_get_arr_type(g.get(), id);
        const void * data = gguf_get_arr_data(g.get(), id);
        for (size_t i = 0; i < n; ++i) {
            if (at == GGUF_TYPE_INT32) layers.push_back(((const int32_t *) data)[i]);
            else if (at == GGUF_TYPE_UINT32) layers.push_back(((const uint32_t *) data)[i]);
        }
    }
    if (layers.empty()) fail("it names no target layers (" + arch + ".target_layers)");
    // EAGLE-3 may read layer n_layer (the target's final hidden state); DFlash reads layer inputs
    const int64_t max_layer = t == COMMON_SPECULATIVE_TYPE_DRAFT_EAGLE3 ? n_layer_tgt : n_layer_tgt - 1;
    for (int64_t il : layers) {
        if (il < 0 || il > max_layer) {
            fail("it reads target layer " + std::to_string(il) + " but the target has " + std::to_string(n_layer_tgt) +
                 " layers (it was made for another model)");
        }
    }

    if (t == COMMON_SPECULATIVE_TYPE_DRAFT_EAGLE3) {
        int64_t hidden = 0;
        if (!u32_key("eagle3.target_hidden_size", hidden) || hidden != n_embd_tgt) {
            fail("it expects target hidden states of width " + std::to_string(hidden) + ", the target's are " +
                 std::to_string(n_embd_tgt));
        }
        if (gguf_find_tensor(g.get(), "token_embd.weight") < 0 && n_embd_dft != n_embd_tgt) {
            fail("it borrows the target's token embeddings (it has none) but its width " + std::to_string(n_embd_dft) +
                 " differs from the target's " + std::to_string(n_embd_tgt));
        }
    } else {
        if (n_embd_dft != n_embd_tgt) {
            fail("its width " + std::to_string(n_embd_dft) + " differs from the target's " + std::to_string(n_embd_tgt));
        }
        int64_t mask = -1;
        if (!u32_key("tokenizer.ggml.mask_token_id", mask) || mask < 0 || mask >= dft.n_vocab()) {
            fail("it has no valid mask token (tokenizer.ggml.mask_token_id)");
        }
        int64_t block = 0;
        if (t == COMMON_SPECULATIVE_TYPE_DRAFT_DSPARK && !u32_key("dflash.block_size", block)) {
            fail("a DSpark drafter needs dflash.block_size");
        }
    }
}

// upstream's common_ngram_cache_load asserts (aborts) on a malformed file: walk it first.
void check_ngram_cache_file(const std::string & path, const Model & tgt, const char * which) {
    std::ifstream f(path, std::ios::binary);
    auto fail = [&](const std::string & why) {
        throw Error(ErrorKind::InvalidOption, std::string("ngram_cache ") + which + " file '" + path + "' " + why, 0,
                    false, path);
    };
    if (!f) fail("cannot be opened");
    const int32_t n_vocab = tgt.n_vocab();
    common_ngram ngram;
    while (f.read(reinterpret_cast<char *>(&ngram), sizeof(ngram))) {
        int32_t n = 0;
        if (!f.read(reinterpret_cast<char *>(&n), sizeof(n)) || n <= 0) fail("is not an n-gram cache (bad entry)");
        for (int32_t i = 0; i < n; ++i) {
            int32_t pair[2];
            if (!f.read(reinterpret_cast<char *>(pair), sizeof(pair))) fail("is truncated");
            if (pair[0] < 0 || pair[0] >= n_vocab || pair[1] <= 0) {
                fail("holds token " + std::to_string(pair[0]) + " outside this model's vocabulary (or a bad count)");
            }
        }
    }
    if (f.gcount() != 0) fail("is truncated");
}

}  // namespace

// ---------------------------------------------------------------------------------------------------
// session

std::shared_ptr<SpecSession> SpecSession::create(std::shared_ptr<Model> model, llama_context_params params,
                                                 SpecConfig config, std::shared_ptr<Model> draft_model) {
    const int32_t n_draft = config.n_draft;
    if (n_draft < 1) throw Error(ErrorKind::InvalidOption, "n_draft must be >= 1");
    if (config.n_draft_min < 0 || config.n_draft_min > n_draft) {
        throw Error(ErrorKind::InvalidOption, "n_draft_min must be within [0, n_draft]");
    }
    if (config.methods.empty()) throw Error(ErrorKind::InvalidOption, "no speculative method given");

    // methods -> upstream types; at most one stage drafts with a model (they would share ctx_dft)
    std::vector<common_speculative_type> types;
    common_speculative_type model_type = COMMON_SPECULATIVE_TYPE_NONE;
    for (const std::string & name : config.methods) {
        const common_speculative_type t = common_speculative_type_from_name(name);
        if (t == COMMON_SPECULATIVE_TYPE_COUNT || t == COMMON_SPECULATIVE_TYPE_NONE) {
            throw Error(ErrorKind::InvalidOption, "unknown speculative method '" + name + "' (known: " +
                                                      common_speculative_all_types_str() + ")");
        }
        if (std::find(types.begin(), types.end(), t) != types.end()) {
            throw Error(ErrorKind::InvalidOption, "speculative method '" + name + "' is given twice");
        }
        if (is_model_drafter(t)) {
            if (model_type != COMMON_SPECULATIVE_TYPE_NONE) {
                throw Error(ErrorKind::InvalidOption,
                            "at most one model-based method can be chained (got '" +
                                common_speculative_type_to_str(model_type) + "' and '" + name +
                                "'); chain it with n-gram methods");
            }
            model_type = t;
        }
        types.push_back(t);
    }

    // the drafter's model
    const bool needs_draft_model = model_type != COMMON_SPECULATIVE_TYPE_NONE && model_type != COMMON_SPECULATIVE_TYPE_DRAFT_MTP;
    if (needs_draft_model && !draft_model) {
        throw Error(ErrorKind::DraftModelRequired,
                    "method '" + common_speculative_type_to_str(model_type) + "' drafts with a separate model: pass draft_model");
    }
    if (!needs_draft_model && draft_model) {
        throw Error(ErrorKind::InvalidOption,
                    "draft_model is only used by draft-simple, draft-eagle3, draft-dflash and draft-dspark");
    }
    if (draft_model) {
        if (draft_model->vocab_only()) {
            throw Error(ErrorKind::InvalidOption, "the draft model '" + draft_model->path() +
                                                      "' was loaded with vocab_only=True and cannot draft");
        }
        check_drafter_arch(model_type, *draft_model);
        check_drafter_head(model_type, *model, *draft_model);
        if (model_type == COMMON_SPECULATIVE_TYPE_DRAFT_SIMPLE) check_vocab_compatible(*model, *draft_model);
    }
    if (model_type == COMMON_SPECULATIVE_TYPE_DRAFT_MTP && (llama_model_n_layer_nextn(model->get()) <= 0 || !model->mtp_loaded())) {
        llama_context_params dp = params;
        dp.ctx_type = LLAMA_CONTEXT_TYPE_MTP;
        Context::create(model, dp);  // throws the precise UnsupportedModel error
    }
    if (!config.ngram_cache_static.empty()) check_ngram_cache_file(config.ngram_cache_static, *model, "static");
    if (!config.ngram_cache_dynamic.empty()) check_ngram_cache_file(config.ngram_cache_dynamic, *model, "dynamic");

    const int32_t n_seq = config.n_seq;
    if (n_seq < 1 || n_seq > 64) {
        throw Error(ErrorKind::InvalidOption, "n_seq must be within [1, 64], got " + std::to_string(n_seq));
    }
    if (n_seq > 1 && config.adaptive) {
        throw Error(ErrorKind::InvalidOption,
                    "n_draft='auto' needs n_seq=1: its costs are measured per verify of one sequence (see ADR 0012)");
    }
    if ((int64_t) n_seq * (1 + n_draft) > (int64_t) params.n_batch) {
        throw Error(ErrorKind::InvalidOption, "n_batch (" + std::to_string(params.n_batch) + ") must hold a verify of every " +
                                                  "sequence: n_seq * (1 + n_draft) = " + std::to_string(n_seq * (1 + n_draft)));
    }

    auto core = std::make_shared<SpecCore>();
    core->config = config;

    // target: keep n_draft recurrent-state snapshots per sequence (rollback of rejected drafts on
    // recurrent/hybrid models) and room for 1 + n_draft output rows per verify
    // n_seq sequences of n_ctx tokens each, in separate cache streams
    const auto limits = common_speculative_get_output_limits((int32_t) params.n_batch, n_seq, n_draft);
    llama_context_params tp = params;
    tp.ctx_type = LLAMA_CONTEXT_TYPE_DEFAULT;
    tp.n_seq_max = (uint32_t) n_seq;
    tp.n_ctx = params.n_ctx * (uint32_t) n_seq;
    tp.kv_unified = false;
    tp.n_rs_seq = (uint32_t) n_draft;
    tp.n_outputs_max = (uint32_t) limits.total;
    tp.n_outputs_max_per_seq = (uint32_t) limits.per_seq;
    core->tgt = Context::create(model, tp);
    auto needs_rollback = [](const Model & m) {
        return llama_model_is_recurrent(m.get()) || llama_model_is_hybrid(m.get());
    };
    if (needs_rollback(*model) && llama_n_rs_seq(core->tgt->get()) == 0) {
        throw Error(ErrorKind::UnsupportedModel,
                    "'" + model->path() + "' is a recurrent model whose state llama.cpp cannot roll back, so rejected "
                    "drafts cannot be undone: speculative decoding is not supported for it", 0, false, model->path());
    }

    // the draft context: same size as the target, built against it
    if (model_type != COMMON_SPECULATIVE_TYPE_NONE) {
        llama_context_params dp = params;
        dp.n_ctx = llama_n_ctx(core->tgt->get());
        dp.n_seq_max = (uint32_t) n_seq;  // as many as the speculative state (draft-simple checks this)
        dp.kv_unified = false;
        dp.n_rs_seq = 0;
        dp.ctx_type = LLAMA_CONTEXT_TYPE_DEFAULT;
        std::shared_ptr<Model> dm = draft_model;
        if (model_type == COMMON_SPECULATIVE_TYPE_DRAFT_MTP) {
            dp.ctx_type = LLAMA_CONTEXT_TYPE_MTP;
            dm = model;
        } else {
            // DFlash/DSpark sample a whole block of drafts on the backend: room for 1 + n_draft rows
            // (with fewer, every draft comes back empty, silently)
            dp.n_outputs_max = (uint32_t) limits.total;
            dp.n_outputs_max_per_seq = (uint32_t) limits.per_seq;
            if (needs_rollback(*dm)) dp.n_rs_seq = (uint32_t) n_draft + 1;  // it rolls back its own drafts too
        }
        core->dft = Context::create(dm, dp, core->tgt);
        if (model_type != COMMON_SPECULATIVE_TYPE_DRAFT_MTP && needs_rollback(*dm) && llama_n_rs_seq(core->dft->get()) == 0) {
            throw Error(ErrorKind::UnsupportedModel,
                        "the draft model '" + dm->path() + "' is recurrent and llama.cpp cannot roll its state back",
                        0, false, dm->path());
        }
    }

    common_params_speculative sp;
    sp.types = types;
    sp.draft.n_max = n_draft;
    sp.draft.n_min = config.n_draft_min;
    sp.draft.p_min = config.p_min;
    // EAGLE-3 with several sequences: with its draft sampling offloaded to the backend (upstream's
    // default), sequence 0 accepts far fewer drafts whenever other sequences draft with it (the
    // drafts differ, the output stays exact); sampling the drafts on the CPU gives every sequence
    // what it gets alone (ADR 0012)
    if (n_seq > 1 && model_type == COMMON_SPECULATIVE_TYPE_DRAFT_EAGLE3) sp.draft.backend_sampling = false;
    sp.draft.ctx_tgt = core->tgt->get();
    sp.draft.ctx_dft = core->dft ? core->dft->get() : nullptr;
    for (auto * ng : {&sp.ngram_simple, &sp.ngram_map_k, &sp.ngram_map_k4v}) {
        ng->size_n = (uint16_t) config.ngram_size_n;
        ng->size_m = (uint16_t) n_draft;
        ng->min_hits = (uint16_t) config.ngram_min_hits;
    }
    // ngram-simple proposes nothing unless its m-gram is at least as long as its key (upstream's
    // common_ngram_simple_draft): let it find size_n tokens; the draft is cut to n_draft anyway
    sp.ngram_simple.size_m = (uint16_t) std::max(n_draft, config.ngram_size_n);
    sp.ngram_mod.n_match = config.ngram_mod_n_match;
    sp.ngram_mod.n_max = n_draft;
    sp.ngram_mod.n_min = config.n_draft_min;
    sp.ngram_cache.lookup_cache_static = config.ngram_cache_static;
    sp.ngram_cache.lookup_cache_dynamic = config.ngram_cache_dynamic;
    {
        LogCapture capture;
        common_speculative * spec = nullptr;
        try {
            // must run before the first target decode: it switches on the target's hidden-row output
            spec = common_speculative_init(sp, (uint32_t) n_seq);
        } catch (const std::exception & e) {
            // upstream's own checks (most are made above, with better messages)
            const std::string what = e.what();
            const ErrorKind kind = what.find("vocab") != std::string::npos  ? ErrorKind::IncompatibleVocab
                                   : what.find("p-min") != std::string::npos ? ErrorKind::InvalidOption
                                                                             : ErrorKind::UnsupportedModel;
            throw Error(kind, "speculative decoding could not be set up: " + what, 0, false,
                        draft_model ? draft_model->path() : model->path());
        }
        if (spec == nullptr) {
            throw Error(ErrorKind::Generic, "common_speculative_init failed: " + capture.summary());
        }
        core->spec.reset(spec);
    }
    for (const auto & st : common_speculative_get_impl_stats(core->spec.get())) core->stage_types.push_back(st.type);
    core->stats = std::make_unique<SpecStatsBox>((size_t) n_draft, core->stage_types.size(), (size_t) n_seq);
    if (config.adaptive) core->policy = std::make_unique<DraftLengthPolicy>(n_draft, config.n_draft_min);

    auto s = std::shared_ptr<SpecSession>(new SpecSession());
    s->engine_ = std::make_shared<SpecEngine>(core);
    s->core_ = std::move(core);
    return s;
}

std::shared_ptr<Run> SpecSession::start(GenRequest req) { return engine_->start(engine_, std::move(req)); }

bool SpecSession::busy() const { return engine_->n_taken() >= core_->config.n_seq; }

int32_t SpecSession::n_running() const { return engine_->n_taken(); }

void ngram_cache_create(const std::vector<llama_token> & tokens, const std::string & path) {
    common_ngram_cache cache;
    std::vector<llama_token> inp(tokens);
    common_ngram_cache_update(cache, LLAMA_NGRAM_STATIC, LLAMA_NGRAM_STATIC, inp, (int) inp.size(), false);
    {
        // common_ngram_cache_save reports nothing when it cannot write: find out first
        std::ofstream probe(path, std::ios::binary);
        if (!probe) throw Error(ErrorKind::Generic, "cannot write the n-gram cache file '" + path + "'", 0, false, path);
    }
    common_ngram_cache_save(cache, path);
}

// ---------------------------------------------------------------------------------------------------
// bindings

static nb::typed<nb::dict, nb::str, nb::any> counters_to_dict(const SpecCounters & c, const SpecCore & core) {
    nb::typed<nb::dict, nb::str, nb::any> d;
    d["iterations"] = c.iterations;
    d["passes"] = c.passes;
    d["drafts_generated"] = c.drafts_generated;
    d["drafts_accepted"] = c.drafts_accepted;
    d["tokens_emitted"] = c.tokens_emitted;
    d["shadow_drafts"] = c.shadow_drafts;
    d["shadow_accepted"] = c.shadow_accepted;
    d["rate_tokens"] = c.rate_tokens;
    d["window_s"] = c.window_s;
    d["draft_us"] = c.draft_us;
    d["verify_us"] = c.verify_us;
    d["sample_us"] = c.sample_us;
    d["prefill_us"] = c.prefill_us;
    d["total_us"] = c.total_us;
    d["n_draft"] = core.config.n_draft;
    d["drafted_per_position"] = nb::cast(c.drafted_per_position);
    d["accepted_per_position"] = nb::cast(c.accepted_per_position);
    d["draft_length_histogram"] = nb::cast(c.draft_length_histogram);
    d["adaptive"] = core.policy != nullptr;
    nb::list stages;
    for (size_t i = 0; i < c.stages.size() && i < core.stage_types.size(); ++i) {
        const StageCounters & sc = c.stages[i];
        nb::dict sd;
        sd["method"] = common_speculative_type_to_str(core.stage_types[i]);
        sd["drafts"] = sc.drafts;
        sd["drafts_generated"] = sc.drafts_generated;
        sd["drafts_accepted"] = sc.drafts_accepted;
        sd["draft_us"] = sc.draft_us;
        sd["drafted_per_position"] = nb::cast(sc.drafted_per_position);
        sd["accepted_per_position"] = nb::cast(sc.accepted_per_position);
        stages.append(sd);
    }
    d["stages"] = stages;
    return d;
}

static SpecConfig config_from_dict(const nb::dict & d) {
    SpecConfig c;
    dict_get(d, "methods", c.methods);
    dict_get(d, "n_draft", c.n_draft);
    dict_get(d, "n_draft_min", c.n_draft_min);
    dict_get(d, "adaptive", c.adaptive);
    dict_get(d, "p_min", c.p_min);
    dict_get(d, "ngram_size_n", c.ngram_size_n);
    dict_get(d, "ngram_min_hits", c.ngram_min_hits);
    dict_get(d, "ngram_mod_n_match", c.ngram_mod_n_match);
    dict_get(d, "ngram_cache_static", c.ngram_cache_static);
    dict_get(d, "ngram_cache_dynamic", c.ngram_cache_dynamic);
    dict_get(d, "n_seq", c.n_seq);
    return c;
}

void register_speculative(nb::module_ & m) {
    nb::class_<SpecSession>(m, "SpecSession", "Speculative decoding engine (native core; use llamaspec.Speculative).")
        .def_static(
            "create",
            [](std::shared_ptr<Model> model, nb::typed<nb::dict, nb::str, nb::any> options,
               nb::typed<nb::dict, nb::str, nb::any> config, std::shared_ptr<Model> draft_model) {
                llama_context_params p = context_params_from_dict(options);
                SpecConfig c = config_from_dict(config);
                nb::gil_scoped_release nogil;
                return SpecSession::create(std::move(model), p, std::move(c), std::move(draft_model));
            },
            nb::arg("model"), nb::arg("options"), nb::arg("config"), nb::arg("draft_model").none(),
            "Check the configuration, build the target and draft contexts and the speculative state (releases the GIL).")
        .def_prop_ro("target", [](const SpecSession & s) { return s.core()->tgt; })
        .def_prop_ro("draft", [](const SpecSession & s) { return s.core()->dft; })
        .def_prop_ro("n_draft", [](const SpecSession & s) { return s.core()->config.n_draft; })
        .def_prop_ro("methods",
                     [](const SpecSession & s) {
                         std::vector<std::string> names;
                         for (auto t : s.core()->stage_types) names.push_back(common_speculative_type_to_str(t));
                         return names;
                     },
                     "The stages, in the order upstream tries them for each draft.")
        .def_prop_ro("n_seq", [](const SpecSession & s) { return s.core()->config.n_seq; })
        .def_prop_ro("busy", &SpecSession::busy, "Every sequence is taken.")
        .def_prop_ro("n_running", &SpecSession::n_running, "Sequences taken by a generation.")
        .def(
            "stats",
            [](const SpecSession & s, int32_t seq) { return counters_to_dict(s.core()->stats->snapshot(seq), *s.core()); },
            nb::arg("seq") = -1,
            "A consistent snapshot of the cumulative counters, in total (seq < 0) or of one sequence (never "
            "waits for the generation).")
        .def("reset_stats", [](SpecSession & s) { s.core()->stats->reset(); })
        .def("start",
             [](SpecSession & s, std::vector<llama_token> prompt, int32_t max_tokens, std::vector<std::string> stop,
                nb::typed<nb::dict, nb::str, nb::any> sampling, std::string grammar_root) {
                 GenRequest req = make_request(std::move(prompt), max_tokens, std::move(stop), sampling,
                                               std::move(grammar_root));
                 nb::gil_scoped_release nogil;
                 return s.start(std::move(req));
             },
             nb::arg("prompt"), nb::arg("max_tokens"), nb::arg("stop"), nb::arg("sampling"), nb::arg("grammar_root"),
             "Start a speculative generation on a free sequence; returns its Run (releases the GIL).");

    nb::class_<DraftLengthPolicy>(m, "DraftLengthPolicy",
                                  "The adaptive draft-length policy (n_draft='auto'), exposed for tests.")
        .def(nb::init<int32_t, int32_t>(), nb::arg("n_max"), nb::arg("n_min") = 0)
        .def("choose", &DraftLengthPolicy::choose, "The draft length for the next verify.")
        .def("observe", &DraftLengthPolicy::observe, nb::arg("n_requested"), nb::arg("n_drafted"),
             nb::arg("n_accepted"), nb::arg("draft_us"), nb::arg("rest_us"), "What that verify did and cost.")
        .def_prop_ro("shadow", &DraftLengthPolicy::shadow,
                     "Whether the plain step just chosen carries a shadow draft (drafted, not verified).")
        .def_prop_ro("shadow_length", &DraftLengthPolicy::shadow_length, "The length of a shadow draft.")
        .def("observe_shadow", &DraftLengthPolicy::observe_shadow, nb::arg("drafted"), nb::arg("accepted"),
             nb::arg("draft_us"), "What a shadow draft did: produced a token, matched the plain step's, its cost.")
        .def("expected_tokens", &DraftLengthPolicy::expected_tokens, nb::arg("k"))
        .def("expected_us", &DraftLengthPolicy::expected_us, nb::arg("k"));

    m.def(
        "ngram_cache_create",
        [](std::vector<llama_token> tokens, std::string path) {
            nb::gil_scoped_release nogil;
            ngram_cache_create(tokens, path);
        },
        nb::arg("tokens"), nb::arg("path"),
        "Write a static n-gram cache (llama-lookup-create's format) built from tokens (releases the GIL).");
}

}  // namespace llamaspec
