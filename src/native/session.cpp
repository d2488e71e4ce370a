// Sessions (plain, or speculative through upstream common_speculative: every drafter, chained): the
// checks, the contexts, the drafter, and the Python bindings of sessions and their calls.
#include "session.h"

#include <nanobind/stl/shared_ptr.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include <algorithm>
#include <cstring>
#include <fstream>
#include <tuple>

#include "dict_util.h"
#include "logging.h"
#include "ngram-cache.h"  // common
#include "ggml-cpp.h"
#include "gguf.h"

namespace nb = nanobind;

namespace llamaspec {

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
void check_drafter_head(common_speculative_type t, const Model & tgt, const Model & dft, float p_min) {
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
    // A head without an output layer computes its logits with the target's (llama.cpp's ctx_other),
    // so its context must reach the workers that hold it: ggml aborts the first decode otherwise
    // ("pre-allocated tensor (output.weight) in a buffer that cannot run the operation").
    if (gguf_find_tensor(g.get(), "output.weight") < 0 && !tgt.rpc_endpoints().empty() &&
        tgt.rpc_endpoints() != dft.rpc_endpoints()) {
        throw Error(ErrorKind::InvalidOption,
                    "the drafter '" + dft.path() + "' computes with the target's output layer, which is on RPC "
                    "workers: load it with the same rpc_servers as the target", 0, false, dft.path());
    }
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
        // p_min reads DSpark's confidence head (upstream: a missing key means it has one)
        if (t == COMMON_SPECULATIVE_TYPE_DRAFT_DSPARK && p_min > 0.0f) {
            const int64_t conf = gguf_find_key(g.get(), "dflash.has_confidence_head");
            if (conf >= 0 && !(gguf_get_kv_type(g.get(), conf) == GGUF_TYPE_BOOL && gguf_get_val_bool(g.get(), conf))) {
                throw Error(ErrorKind::InvalidOption,
                            "p_min needs a DSpark drafter with a confidence head, and '" + dft.path() +
                                "' has none (dflash.has_confidence_head is false): use p_min=0", 0, false, dft.path());
            }
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

// The target context of a session: n_seq sequences of n_ctx tokens each, in separate cache streams,
// and an n_batch that holds one pass of every sequence ([last, n_draft drafts] each), with room for
// the output rows of one pass (1 + n_draft per sequence; ADR 0033). Speculative sessions also keep
// n_draft recurrent-state snapshots per sequence (the rollback of rejected drafts on
// recurrent/hybrid models).
llama_context_params target_params(const llama_context_params & params, int32_t n_seq, int32_t n_draft) {
    if ((int64_t) n_seq * (1 + n_draft) > (int64_t) params.n_batch) {
        throw Error(ErrorKind::InvalidOption,
                    "n_batch (" + std::to_string(params.n_batch) + ") must hold " +
                        (n_draft > 0 ? "a verify of every sequence: n_seq * (1 + n_draft) = " + std::to_string(n_seq * (1 + n_draft))
                                     : "one token of every sequence: n_seq = " + std::to_string(n_seq)));
    }
    llama_context_params tp = params;
    tp.ctx_type = LLAMA_CONTEXT_TYPE_DEFAULT;
    tp.n_seq_max = (uint32_t) n_seq;
    tp.n_ctx = params.n_ctx * (uint32_t) n_seq;
    tp.kv_unified = false;
    if (n_draft > 0) tp.n_rs_seq = (uint32_t) n_draft;
    // output rows for what a pass reads (as llama-server sizes them), not llama.cpp's default of
    // n_batch: with that, the graph reserved for the worst case outputs a whole micro-batch and
    // does not match a prompt chunk's (one output row), and prompt decodes were slower (ADR 0033)
    const auto limits = common_speculative_get_output_limits((int32_t) params.n_batch, n_seq, n_draft);
    tp.n_outputs_max = (uint32_t) limits.total;
    tp.n_outputs_max_per_seq = (uint32_t) limits.per_seq;
    return tp;
}

// A sequence id given to the policy from Python: within [0, n_seq), else InvalidOptionError.
int32_t policy_seq(const DraftLengthPolicy & p, int32_t seq) {
    if (seq < 0 || seq >= p.n_seq()) {
        throw Error(ErrorKind::InvalidOption, "sequence id " + std::to_string(seq) + " is not within [0, n_seq)");
    }
    return seq;
}

}  // namespace

// ---------------------------------------------------------------------------------------------------
// session

std::shared_ptr<Session> Session::create(std::shared_ptr<Model> model, llama_context_params params, SpecConfig config,
                                         std::shared_ptr<Model> draft_model) {
    const int32_t n_seq = config.n_seq;
    if (n_seq < 1 || n_seq > 64) {
        throw Error(ErrorKind::InvalidOption, "n_seq must be within [1, 64], got " + std::to_string(n_seq));
    }
    if (config.methods.empty()) return create_plain(std::move(model), params, std::move(config), draft_model);
    const int32_t n_draft = config.n_draft;
    if (n_draft < 1) throw Error(ErrorKind::InvalidOption, "n_draft must be >= 1");
    if (config.n_draft_min < 0 || config.n_draft_min > n_draft) {
        throw Error(ErrorKind::InvalidOption, "n_draft_min must be within [0, n_draft]");
    }

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
        check_drafter_head(model_type, *model, *draft_model, config.p_min);
        if (model_type == COMMON_SPECULATIVE_TYPE_DRAFT_SIMPLE) check_vocab_compatible(*model, *draft_model);
    }
    if (model_type == COMMON_SPECULATIVE_TYPE_DRAFT_MTP && (llama_model_n_layer_nextn(model->get()) <= 0 || !model->mtp_loaded())) {
        llama_context_params dp = params;
        dp.ctx_type = LLAMA_CONTEXT_TYPE_MTP;
        Context::create(model, dp);  // throws the precise UnsupportedModel error
    }
    if (!config.ngram_cache_static.empty()) check_ngram_cache_file(config.ngram_cache_static, *model, "static");
    if (!config.ngram_cache_dynamic.empty()) check_ngram_cache_file(config.ngram_cache_dynamic, *model, "dynamic");

    const llama_context_params tp = target_params(params, n_seq, n_draft);

    auto core = std::make_shared<Core>();
    core->config = config;

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
        // the target's output rows: DFlash/DSpark sample a whole block of drafts on the backend,
        // 1 + n_draft rows (with fewer, every draft comes back empty, silently); the others read
        // one row per sequence and decode faster with no more reserved (ADR 0033)
        dp.n_outputs_max = tp.n_outputs_max;
        dp.n_outputs_max_per_seq = tp.n_outputs_max_per_seq;
        std::shared_ptr<Model> dm = draft_model;
        if (model_type == COMMON_SPECULATIVE_TYPE_DRAFT_MTP) {
            dp.ctx_type = LLAMA_CONTEXT_TYPE_MTP;
            dm = model;
        } else {
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
            // upstream's own checks: every one we know of is made above, with a precise class and
            // message; anything else says what upstream said
            throw Error(ErrorKind::UnsupportedModel, std::string("speculative decoding could not be set up: ") + e.what(), 0, false,
                        draft_model ? draft_model->path() : model->path());
        }
        if (spec == nullptr) {
            throw Error(ErrorKind::Generic, "common_speculative_init failed: " + capture.summary());
        }
        core->spec.reset(spec);
    }
    for (const auto & st : common_speculative_get_impl_stats(core->spec.get())) {
        core->stage_types.push_back(st.type);
        core->stage_names.push_back(common_speculative_type_to_str(st.type));
    }
    core->stats = std::make_unique<SpecStatsBox>((size_t) n_draft, core->stage_types.size(), (size_t) n_seq);
    if (config.adaptive) {
        // a recurrent or hybrid target splits a batch into pieces where every sequence has as many rows
        core->policy = std::make_unique<DraftLengthPolicy>(n_draft, config.n_draft_min, n_seq, needs_rollback(*model));
    }
    return from_core(std::move(core));
}

std::shared_ptr<Session> Session::create_plain(std::shared_ptr<Model> model, llama_context_params params,
                                               SpecConfig config, const std::shared_ptr<Model> & draft_model) {
    if (draft_model) throw Error(ErrorKind::InvalidOption, "a draft model needs a speculative method");
    if (config.adaptive) throw Error(ErrorKind::InvalidOption, "n_draft='auto' needs a speculative method");
    const llama_context_params tp = target_params(params, config.n_seq, 0);
    config.n_draft = 0;
    config.n_draft_min = 0;
    auto core = std::make_shared<Core>();
    core->config = config;
    core->tgt = Context::create(std::move(model), tp);
    core->stats = std::make_unique<SpecStatsBox>(0, 0, (size_t) config.n_seq);
    return from_core(std::move(core));
}

std::shared_ptr<Session> Session::from_core(std::shared_ptr<Core> core) {
    auto s = std::shared_ptr<Session>(new Session());
    s->engine_ = std::make_shared<Engine>(core);
    s->core_ = std::move(core);
    return s;
}

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

static nb::typed<nb::dict, nb::str, nb::any> counters_to_dict(const SpecCounters & c, const Core & core) {
    nb::typed<nb::dict, nb::str, nb::any> d = nb::borrow<nb::typed<nb::dict, nb::str, nb::any>>(c.to_dict(core.stage_names));
    d["n_draft"] = core.config.n_draft;
    d["adaptive"] = core.policy != nullptr;
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
    dict_get(d, "ctx_checkpoints", c.ctx_checkpoints);
    dict_get(d, "checkpoint_every", c.checkpoint_every);
    dict_get(d, "prompt_cache_mb", c.prompt_cache_mb);
    return c;
}

void register_session(nb::module_ & m) {
    nb::class_<Run>(m, "Run", "One generation call in progress (native core; consumed by the session objects).")
        .def("next",
             [](Run & r, double timeout) -> nb::object {
                 // Wait in slices so that Ctrl-C (a pending signal) is noticed while we block.
                 const auto slice = std::chrono::milliseconds(50);
                 const bool forever = timeout < 0;
                 const auto deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                                          std::chrono::duration<double>(forever ? 0.0 : timeout));
                 while (true) {
                     std::optional<Event> ev;
                     if (!forever && timeout == 0) {
                         ev = r.next(std::chrono::microseconds(0));  // a look, no wait: the GIL stays
                     } else {
                         nb::gil_scoped_release nogil;
                         auto wait = std::chrono::duration_cast<std::chrono::microseconds>(slice);
                         if (!forever) {
                             auto left = std::chrono::duration_cast<std::chrono::microseconds>(deadline - Clock::now());
                             if (left < wait) wait = std::max(left, std::chrono::microseconds(1));
                         }
                         ev = r.next(wait);
                     }
                     if (ev) return event_to_python(*ev);
                     if (PyErr_CheckSignals() != 0) throw nb::python_error();
                     if (!forever && Clock::now() >= deadline) return nb::none();
                 }
             },
             nb::arg("timeout"), nb::sig("def next(self, timeout: float) -> tuple[typing.Any, ...] | None"),
             "Next event as (0, id, text, origin, drafted[, logprob, top]) | (1, id) | (2, stats) | (4, processed, total, "
             "prompt_time, cached) or None after timeout seconds (< 0: no limit, 0: only look). Releases the "
             "GIL while waiting; a failure of the call is raised here.")
        .def("cancel", &Run::cancel,
             "Stop this call within one engine step (also inside its prompt); no-op once it is over.")
        .def("close",
             [](Run & r) {
                 nb::gil_scoped_release nogil;
                 r.close();
             },
             "Cancel, wait until the engine has let go of the call, free its sequence (releases the GIL).")
        .def("set_wake_fd", &Run::set_wake_fd, nb::arg("fd"),
             "Write one byte to this file descriptor at every event (-1: stop); for event loops.")
        .def_prop_ro("closed", &Run::closed)
        .def_prop_ro("seq", &Run::seq, "The sequence this call decodes on.");

    nb::class_<Session>(m, "Session", "A generation session, plain or speculative (native core; use llamaspec.Generator "
                                      "or llamaspec.Speculative).")
        .def_static(
            "create",
            [](std::shared_ptr<Model> model, nb::typed<nb::dict, nb::str, nb::any> options,
               nb::typed<nb::dict, nb::str, nb::any> config, std::shared_ptr<Model> draft_model) {
                llama_context_params p = context_params_from_dict(options);
                SpecConfig c = config_from_dict(config);
                nb::gil_scoped_release nogil;
                return Session::create(std::move(model), p, std::move(c), std::move(draft_model));
            },
            nb::arg("model"), nb::arg("options"), nb::arg("config"), nb::arg("draft_model").none(),
            "Check the configuration, build the contexts and the speculative state (no methods: a plain session; releases the GIL).")
        .def_prop_ro("target", [](const Session & s) { return s.core()->tgt; })
        .def_prop_ro("draft", [](const Session & s) { return s.core()->dft; })
        .def_prop_ro("n_draft", [](const Session & s) { return s.core()->config.n_draft; })
        .def_prop_ro("methods", [](const Session & s) { return s.core()->stage_names; },
                     "The stages, in the order upstream tries them for each draft.")
        .def_prop_ro("n_seq", [](const Session & s) { return s.core()->config.n_seq; })
        .def_prop_ro("busy", &Session::busy, "Every sequence is taken.")
        .def_prop_ro("n_running", &Session::n_running, "Sequences taken by a generation.")
        .def(
            "stats",
            [](const Session & s, int32_t seq) { return counters_to_dict(s.core()->stats->snapshot(seq), *s.core()); },
            nb::arg("seq") = -1,
            "A consistent snapshot of the cumulative counters, in total (seq < 0) or of one sequence (never "
            "waits for the generation).")
        .def("reset_stats", [](Session & s) { s.core()->stats->reset(); })
        .def(
            "prompt_cache",
            [](const Session & s) {
                std::vector<SeqCacheInfo> infos;
                {
                    nb::gil_scoped_release nogil;  // the cache's lock is held across one trim or restore
                    infos = s.cache_info();
                }
                std::vector<std::tuple<int32_t, int32_t, size_t>> out;
                for (const SeqCacheInfo & i : infos) {
                    out.emplace_back(i.tokens, i.checkpoints, i.checkpoint_bytes);
                }
                return out;
            },
            "Per sequence, what its memory holds for the next call: (tokens, checkpoints, checkpoint bytes).")
        .def(
            "prompt_cache_ram",
            [](const Session & s) {
                RamCacheInfo i;
                {
                    nb::gil_scoped_release nogil;  // the cache's lock is held across one save or load
                    i = s.ram_cache_info();
                }
                return std::make_tuple(i.prompts, i.tokens, i.bytes, i.limit_bytes);
            },
            "The host-memory prompt cache: (prompts, tokens, bytes, limit bytes; 0 off, 2**64-1 no limit).")
        .def("start",
             [](Session & s, std::vector<llama_token> prompt, int32_t max_tokens, std::vector<std::string> stop,
                nb::typed<nb::dict, nb::str, nb::any> sampling, std::string grammar_root, bool prompt_progress,
                int32_t draft_max, float p_min, bool cache_prompt, int32_t logprobs, bool post_sampling_probs) {
                 GenRequest req = make_request(std::move(prompt), max_tokens, std::move(stop), sampling,
                                               std::move(grammar_root), prompt_progress, draft_max, p_min,
                                               cache_prompt, logprobs, post_sampling_probs);
                 nb::gil_scoped_release nogil;
                 return s.start(std::move(req));
             },
             nb::arg("prompt"), nb::arg("max_tokens"), nb::arg("stop"), nb::arg("sampling"), nb::arg("grammar_root"),
             nb::arg("prompt_progress") = false, nb::arg("draft_max") = -1, nb::arg("p_min") = -1.0f,
             nb::arg("cache_prompt") = true, nb::arg("logprobs") = -1, nb::arg("post_sampling_probs") = false,
             "Start a generation on a free sequence; returns its Run (releases the GIL).");

    nb::class_<DraftLengthPolicy>(m, "DraftLengthPolicy",
                                  "The adaptive draft-length policy (n_draft='auto'), exposed for tests.")
        .def(nb::init<int32_t, int32_t, int32_t, bool>(), nb::arg("n_max"), nb::arg("n_min") = 0, nb::arg("n_seq") = 1,
             nb::arg("equal_lengths") = false)
        .def("choose", nb::overload_cast<>(&DraftLengthPolicy::choose),
             "Sequence 0 alone: the draft length for its next verify.")
        .def("observe", &DraftLengthPolicy::observe, nb::arg("n_requested"), nb::arg("n_drafted"),
             nb::arg("n_accepted"), nb::arg("draft_us"), nb::arg("rest_us"), "Sequence 0 alone: what that verify did and cost.")
        .def_prop_ro("shadow", nb::overload_cast<>(&DraftLengthPolicy::shadow, nb::const_),
                     "Sequence 0 alone: whether the plain step just chosen carries a shadow draft (drafted, not verified).")
        .def_prop_ro("shadow_length", &DraftLengthPolicy::shadow_length, "The length of a shadow draft.")
        .def("observe_shadow", nb::overload_cast<bool, bool, double>(&DraftLengthPolicy::observe_shadow),
             nb::arg("drafted"), nb::arg("accepted"), nb::arg("draft_us"),
             "Sequence 0 alone: what a shadow draft did: produced a token, matched the plain step's, its cost.")
        .def("choose_step",
             [](DraftLengthPolicy & p, const std::vector<int32_t> & seqs) {
                 std::vector<bool> seen((size_t) p.n_seq(), false);
                 for (int32_t id : seqs) {
                     if (seen[(size_t) policy_seq(p, id)]) throw Error(ErrorKind::InvalidOption, "sequence ids must be distinct");
                     seen[(size_t) id] = true;
                 }
                 std::vector<int32_t> lengths;
                 p.choose(seqs, lengths);
                 return lengths;
             },
             nb::arg("seqs"), "The draft length of each of these sequences for one step (0: plain).")
        .def("shadow_of",
             [](const DraftLengthPolicy & p, int32_t seq) { return p.shadow(policy_seq(p, seq)); }, nb::arg("seq"),
             "Whether that sequence's plain step just chosen carries a shadow draft.")
        .def("observe_shadow_of",
             [](DraftLengthPolicy & p, int32_t seq, bool drafted, bool accepted, double draft_us) {
                 p.observe_shadow(policy_seq(p, seq), drafted, accepted, draft_us);
             },
             nb::arg("seq"), nb::arg("drafted"), nb::arg("accepted"), nb::arg("draft_us"),
             "What a sequence's shadow draft did.")
        .def("observe_draft",
             [](DraftLengthPolicy & p, int32_t seq, int32_t n_requested, int32_t n_drafted, int32_t n_accepted) {
                 p.observe_draft(policy_seq(p, seq), n_requested, n_drafted, n_accepted);
             },
             nb::arg("seq"), nb::arg("n_requested"), nb::arg("n_drafted"), nb::arg("n_accepted"),
             "What a sequence's verify did.")
        .def("observe_step", &DraftLengthPolicy::observe_step, nb::arg("rows"), nb::arg("k_max"),
             nb::arg("draft_us"), nb::arg("rest_us"), "What the whole step verified and cost.")
        .def("expected_tokens",
             [](const DraftLengthPolicy & p, int32_t k, int32_t seq) { return p.expected_tokens(k, policy_seq(p, seq)); },
             nb::arg("k"), nb::arg("seq") = 0)
        .def("expected_us", &DraftLengthPolicy::expected_us, nb::arg("k"));

    m.def("sampling_option_names", &sampling_option_names, "The sampling options the native core reads.");
    m.def("context_option_names", &context_option_names, "The context options the native core reads.");

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
