// A generation call's parts: sampling options and sampler, event queue, stop strings, emitter, state.
#include "call.h"

#include <unistd.h>

#include <regex>

#include <nanobind/stl/shared_ptr.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include "dict_util.h"
#include "logging.h"

namespace nb = nanobind;

namespace llamaspec {

double seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

// ---------------------------------------------------------------------------------------------------
// sampling

namespace {
using SP = common_params_sampling;
// Every sampling option (src/llamaspec/_options.py SAMPLING_OPTIONS, less stop, grammar_root and the
// log-probability options, which the call itself takes, and json_schema, which the Python face turns
// into grammar), then the fields a chat template's tools set (_options.py CHAT_SAMPLING_FIELDS, from
// ChatPrompt, never from a caller).
const OptionField<SP> kSamplingOptions[] = {
    LLAMASPEC_OPTION_FIELD(SP, "temperature", temp, float),
    LLAMASPEC_OPTION_FIELD(SP, "top_k", top_k, int32_t),
    LLAMASPEC_OPTION_FIELD(SP, "top_p", top_p, float),
    LLAMASPEC_OPTION_FIELD(SP, "min_p", min_p, float),
    LLAMASPEC_OPTION_FIELD(SP, "typical_p", typ_p, float),
    LLAMASPEC_OPTION_FIELD(SP, "min_keep", min_keep, int32_t),
    LLAMASPEC_OPTION_FIELD(SP, "seed", seed, int64_t),
    LLAMASPEC_OPTION_FIELD(SP, "repeat_penalty", penalty_repeat, float),
    LLAMASPEC_OPTION_FIELD(SP, "frequency_penalty", penalty_freq, float),
    LLAMASPEC_OPTION_FIELD(SP, "presence_penalty", penalty_present, float),
    LLAMASPEC_OPTION_FIELD(SP, "penalty_last_n", penalty_last_n, int32_t),
    LLAMASPEC_OPTION_FIELD(SP, "dry_multiplier", dry_multiplier, float),
    LLAMASPEC_OPTION_FIELD(SP, "dry_base", dry_base, float),
    LLAMASPEC_OPTION_FIELD(SP, "dry_allowed_length", dry_allowed_length, int32_t),
    LLAMASPEC_OPTION_FIELD(SP, "dry_penalty_last_n", dry_penalty_last_n, int32_t),
    LLAMASPEC_OPTION_FIELD(SP, "xtc_probability", xtc_probability, float),
    LLAMASPEC_OPTION_FIELD(SP, "xtc_threshold", xtc_threshold, float),
    LLAMASPEC_OPTION_FIELD(SP, "mirostat", mirostat, int32_t),
    LLAMASPEC_OPTION_FIELD(SP, "mirostat_tau", mirostat_tau, float),
    LLAMASPEC_OPTION_FIELD(SP, "mirostat_eta", mirostat_eta, float),
    {"grammar",
     [](SP & p, nb::handle v) {
         const std::string g = nb::cast<std::string>(v);
         if (!g.empty()) p.grammar = common_grammar(COMMON_GRAMMAR_TYPE_USER, g);
     }},
    {"tool_grammar",  // the template's tool-call grammar: advanced past the generation prompt when not lazy
     [](SP & p, nb::handle v) {
         const std::string g = nb::cast<std::string>(v);
         if (!g.empty()) p.grammar = common_grammar(COMMON_GRAMMAR_TYPE_TOOL_CALLS, g);
     }},
    LLAMASPEC_OPTION_FIELD(SP, "grammar_lazy", grammar_lazy, bool),
    {"grammar_triggers",  // [(common_grammar_trigger_type, value, token), ...]
     [](SP & p, nb::handle v) {
         for (nb::handle item : nb::iter(v)) {
             nb::tuple t = nb::cast<nb::tuple>(item);
             common_grammar_trigger trig;
             trig.type = (common_grammar_trigger_type) nb::cast<int>(t[0]);
             trig.value = nb::cast<std::string>(t[1]);
             trig.token = nb::cast<llama_token>(t[2]);
             p.grammar_triggers.push_back(std::move(trig));
         }
     }},
    {"preserved_tokens",
     [](SP & p, nb::handle v) {
         for (nb::handle t : nb::iter(v)) p.preserved_tokens.insert(nb::cast<llama_token>(t));
     }},
    LLAMASPEC_OPTION_FIELD(SP, "generation_prompt", generation_prompt, std::string),
    {"logit_bias",  // [(token, bias), ...]
     [](SP & p, nb::handle v) {
         for (nb::handle item : nb::iter(v)) {
             nb::tuple t = nb::cast<nb::tuple>(item);
             p.logit_bias.push_back({nb::cast<llama_token>(t[0]), nb::cast<float>(t[1])});
         }
     }},
};
}  // namespace

common_params_sampling sampling_params_from_dict(const nb::dict & o) {
    common_params_sampling p;  // llama.cpp's common defaults (documented in the README)
    apply_options(p, o, kSamplingOptions, "sampling option");
    p.no_perf = true;
    return p;
}

std::vector<std::string> sampling_option_names() { return option_names(kSamplingOptions); }

common_sampler_ptr make_sampler(const Model & model, common_params_sampling params, const std::string & grammar_root) {
    for (const auto & lb : params.logit_bias) model.check_token(lb.token);
    for (llama_token t : params.preserved_tokens) model.check_token(t);  // ids from a ChatPrompt: in this vocab
    for (const auto & t : params.grammar_triggers) {
        if (t.type == COMMON_GRAMMAR_TRIGGER_TYPE_TOKEN) model.check_token(t.token);
    }
    std::string grammar = params.grammar.grammar;
    if (!grammar.empty()) {
        // Parse it once ourselves with the requested root, to report llama.cpp's own parser message.
        LogCapture capture;
        llama_sampler * probe = llama_sampler_init_grammar(model.vocab(), grammar.c_str(), grammar_root.c_str());
        if (probe == nullptr) {
            std::string why = capture.summary();
            throw Error(ErrorKind::Grammar, "invalid grammar" + (why.empty() ? std::string() : ": " + why));
        }
        llama_sampler_free(probe);
        if (grammar_root != "root") {
            // common_sampler always starts at "root": alias it to the requested rule.
            static const std::regex has_root(R"((^|\n)[ \t]*root[ \t]*::=)");
            if (std::regex_search(grammar, has_root)) {
                throw Error(ErrorKind::Grammar, "grammar_root='" + grammar_root +
                                                    "' needs a grammar without its own rule named 'root'");
            }
            params.grammar = common_grammar(COMMON_GRAMMAR_TYPE_USER, "root ::= " + grammar_root + "\n" + grammar);
        }
    }
    LogCapture capture;
    try {
        common_sampler * s = common_sampler_init(model.get(), params);
        if (s == nullptr) {
            throw Error(ErrorKind::InvalidOption, "could not build the sampler: " + capture.summary());
        }
        return common_sampler_ptr(s);
    } catch (const Error &) {
        throw;
    } catch (const std::exception & e) {
        std::string why = capture.summary();
        throw Error(params.grammar.grammar.empty() ? ErrorKind::InvalidOption : ErrorKind::Grammar,
                    std::string(e.what()) + (why.empty() ? std::string() : ": " + why));
    }
}

// ---------------------------------------------------------------------------------------------------
// queue, stop strings, emitter

void EventQueue::push(Event ev) {
    {
        std::lock_guard<std::mutex> lock(mutex_);
        events_.push_back(std::move(ev));
        if (wake_fd_ >= 0) {
            // a full pipe already holds a wake-up: nothing is lost when this write finds no room
            const char byte = 1;
            [[maybe_unused]] ssize_t n = ::write(wake_fd_, &byte, 1);
        }
    }
    cv_.notify_one();
}

void EventQueue::set_wake_fd(int fd) {
    std::lock_guard<std::mutex> lock(mutex_);
    wake_fd_ = fd;
}

std::optional<Event> EventQueue::pop(std::chrono::microseconds timeout) {
    std::unique_lock<std::mutex> lock(mutex_);
    if (timeout.count() < 0) {
        cv_.wait(lock, [this] { return !events_.empty(); });
    } else if (timeout.count() == 0) {  // a look (the async path): no timed wait, no syscall
        if (events_.empty()) return std::nullopt;
    } else if (!cv_.wait_for(lock, timeout, [this] { return !events_.empty(); })) {
        return std::nullopt;
    }
    Event ev = std::move(events_.front());
    events_.pop_front();
    return ev;
}

std::string StopMatcher::process(const std::string & text, bool final, bool & stopped) {
    held_ += text;
    stopped = false;
    size_t best = std::string::npos;
    for (const auto & s : stops_) {
        size_t pos = held_.find(s);
        if (pos < best) best = pos;
    }
    if (best != std::string::npos) {
        stopped = true;
        std::string out = held_.substr(0, best);
        held_.clear();
        return out;
    }
    size_t keep = 0;
    if (!final) {
        // the longest tail of held_ that is a proper prefix of a stop string
        for (const auto & s : stops_) {
            for (size_t k = std::min(s.size() - 1, held_.size()); k > keep; --k) {
                if (held_.compare(held_.size() - k, k, s, 0, k) == 0) {
                    keep = k;
                    break;
                }
            }
        }
    }
    std::string out = held_.substr(0, held_.size() - keep);
    held_.erase(0, held_.size() - keep);
    return out;
}

void TokenEmitter::push_deferred() {
    if (deferred_) {
        queue_.push(std::move(*deferred_));
        deferred_.reset();
    }
}

bool TokenEmitter::token(llama_token id, bool last, std::optional<TokenProbs> probs, Origin origin,
                         int32_t drafted) {
    bool stopped = false;
    const bool keep = !preserved_.empty() && preserved_.count(id);
    std::string text = stop_.process(utf8_.feed(common_token_to_piece(vocab_, id, keep), last), last, stopped);
    push_deferred();
    Event ev{Event::Token, id, std::move(text), {}, std::nullopt};
    ev.probs = std::move(probs);
    ev.origin = origin;
    ev.drafted = drafted;
    if (!stopped && !last && (utf8_.has_pending() || stop_.holding())) {
        // Text is held back: keep this event until the next token, so that if the model ends here the
        // held text can still travel with the token that produced it.
        deferred_ = std::move(ev);
    } else {
        queue_.push(std::move(ev));
    }
    return stopped;
}

void TokenEmitter::end_of_generation() {
    bool stopped = false;
    std::string rest = stop_.process(utf8_.feed("", true), true, stopped);
    if (deferred_) deferred_->text += rest;
    push_deferred();
}

void TokenEmitter::abandon() { push_deferred(); }

// ---------------------------------------------------------------------------------------------------
// requests and call state

void validate_request(const GenRequest & req, const Context & ctx) {
    const Model & model = *ctx.model();
    if (req.prompt.empty()) throw Error(ErrorKind::InvalidOption, "the prompt is empty");
    for (llama_token t : req.prompt) model.check_token(t);
    if (req.max_tokens < 1) throw Error(ErrorKind::InvalidOption, "max_tokens must be >= 1");
    if (req.probs.n_top < -1 || req.probs.n_top > 20) {
        throw Error(ErrorKind::InvalidOption, "top_logprobs must be in [0, 20], got " + std::to_string(req.probs.n_top));
    }
    if (req.probs.post_sampling && !req.probs.on()) {
        throw Error(ErrorKind::InvalidOption, "post_sampling_probs needs logprobs=True");
    }
    const size_t need = req.prompt.size() + (size_t) req.max_tokens;
    if (need > ctx.n_ctx()) {
        throw Error(ErrorKind::ContextOverflow, "prompt (" + std::to_string(req.prompt.size()) + " tokens) + max_tokens (" +
                                                    std::to_string(req.max_tokens) + ") = " + std::to_string(need) +
                                                    " exceeds the context size n_ctx=" + std::to_string(ctx.n_ctx()));
    }
}

GenRequest make_request(std::vector<llama_token> prompt, int32_t max_tokens, std::vector<std::string> stop,
                        const nb::dict & sampling, std::string grammar_root, bool prompt_progress,
                        int32_t draft_max, float p_min, bool cache_prompt, int32_t logprobs,
                        bool post_sampling_probs) {
    GenRequest req;
    req.prompt = std::move(prompt);
    req.max_tokens = max_tokens;
    req.stop = std::move(stop);
    req.sampling = sampling_params_from_dict(sampling);
    req.grammar_root = std::move(grammar_root);
    req.prompt_progress = prompt_progress;
    req.draft_max = draft_max;
    req.p_min = p_min;
    req.cache_prompt = cache_prompt;
    req.probs = ProbsRequest{logprobs, post_sampling_probs};
    return req;
}

void CallState::mark_start() {
    t_start = Clock::now();
    stats.prompt_tokens = (int32_t) req.prompt.size();
    stats.seed = common_sampler_get_seed(smpl.get());
}

void CallState::finish(const char * reason, std::vector<std::pair<std::string, double>> extra) {
    stats.finish_reason = reason;
    stats.total_s = seconds(Clock::now() - t_start);
    queue.push(Event{Event::Done, -1, {}, stats, std::nullopt, std::move(extra)});
}

const char * CallState::emit(TokenEmitter & emitter, const llama_vocab * vocab, llama_token id,
                             std::optional<TokenProbs> probs, Origin origin, int32_t drafted) {
    if (llama_vocab_is_eog(vocab, id)) {
        emitter.end_of_generation();
        queue.push(Event{Event::EndOfGeneration, id, {}, {}, std::nullopt});
        return "stop";
    }
    ++stats.tokens;
    const bool last = stats.tokens == req.max_tokens;
    const bool stopped = emitter.token(id, last, std::move(probs), origin, drafted);
    t_last = Clock::now();
    if (stats.tokens == 1) {
        t_first = t_last;
        stats.ttft_s = seconds(t_first - t_start);
    }
    if (stopped) return "stop";
    if (last) return "length";
    return nullptr;
}

bool decode_ok(int rc, const char * what) {
    if (rc == 0) return true;
    if (rc == 2) return false;
    throw Error::with_code(ErrorKind::Decode, std::string(what) + " failed: llama_decode returned " + std::to_string(rc), rc);
}

// ---------------------------------------------------------------------------------------------------
// bindings

static nb::typed<nb::dict, nb::str, nb::any> stats_to_dict(const GenStats & s) {
    nb::typed<nb::dict, nb::str, nb::any> d;
    d["prompt_tokens"] = s.prompt_tokens;
    d["cached_tokens"] = s.cached_tokens;
    d["tokens"] = s.tokens;
    d["prefill_time"] = s.prefill_s;
    d["time_to_first_token"] = s.ttft_s;
    d["generation_time"] = s.generation_s;
    d["total_time"] = s.total_s;
    d["tokens_per_second"] = s.tokens_per_second();
    d["finish_reason"] = s.finish_reason;
    d["seed"] = s.seed;
    return d;
}

nb::object event_to_python(Event & ev) {
    switch (ev.kind) {
        case Event::Token: {
            const int origin = (int) ev.origin;
            if (!ev.probs) return nb::make_tuple(0, ev.id, nb::str(ev.text.data(), ev.text.size()), origin, ev.drafted);
            nb::list top;
            for (const TopProb & t : ev.probs->top) {
                top.append(nb::make_tuple(t.id, nb::bytes(t.piece.data(), t.piece.size()), t.logprob));
            }
            return nb::make_tuple(0, ev.id, nb::str(ev.text.data(), ev.text.size()), origin, ev.drafted,
                                  ev.probs->logprob, top);
        }
        case Event::EndOfGeneration:
            return nb::make_tuple(1, ev.id);
        case Event::Done: {
            auto d = stats_to_dict(ev.stats);
            for (const auto & kv : ev.extra) d[nb::str(kv.first.c_str())] = kv.second;
            return nb::make_tuple(2, d);
        }
        case Event::PromptProgress:
            return nb::make_tuple(4, ev.processed, ev.stats.prompt_tokens, ev.stats.prefill_s, ev.stats.cached_tokens);
        case Event::Failure:
            break;
    }
    throw *ev.error;
}

}  // namespace llamaspec
