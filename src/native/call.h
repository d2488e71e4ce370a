// What one generation call is made of: its request and sampler, the queue of events between the
// engine thread and the consumer, the text emitter (UTF-8, stop strings) and the call's state.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include <nanobind/nanobind.h>

#include "common.h"    // common
#include "sampling.h"  // common
#include "context.h"
#include "errors.h"
#include "logprobs.h"
#include "utf8.h"

namespace llamaspec {

using Clock = std::chrono::steady_clock;

double seconds(Clock::duration d);

// Sampling options from the dict the Python face validated. Throws Error(InvalidOption).
common_params_sampling sampling_params_from_dict(const nanobind::dict & options);
// The names sampling_params_from_dict takes (for the test that keeps them equal to Python's).
std::vector<std::string> sampling_option_names();

// Builds the sampler; an invalid grammar raises Error(Grammar) naming the problem. Without the GIL.
common_sampler_ptr make_sampler(const Model & model, common_params_sampling params, const std::string & grammar_root);

struct GenStats {
    int32_t prompt_tokens = 0;
    int32_t cached_tokens = 0;  // of the prompt, reused from the sequence's memory (not decoded)
    int32_t tokens = 0;
    double prefill_s = 0;     // decoding the prompt
    double ttft_s = 0;        // start of the call to the first token
    double generation_s = 0;  // first to last token
    double total_s = 0;
    std::string finish_reason = "length";  // "stop" | "length" | "cancelled"
    uint32_t seed = 0;

    double tokens_per_second() const { return tokens > 1 && generation_s > 0 ? (tokens - 1) / generation_s : 0.0; }
};

// How a generated token was produced (Token events; the Python Token's `origin`).
enum class Origin : uint8_t {
    Plain = 0,   // a step that verified no draft (plain decoding, or the first token from the prompt)
    Draft = 1,   // a drafted token the target accepted
    Target = 2,  // the target's own token in a step that verified a draft: the correction after a
                 // rejected draft token, or the extra token after all of them were accepted
};

struct Event {
    enum Kind { Token = 0, EndOfGeneration = 1, Done = 2, Failure = 3, PromptProgress = 4 };
    Kind kind;
    llama_token id = -1;
    std::string text;
    GenStats stats;
    std::optional<Error> error;
    // Done of a speculative run: the call's speculative counts (name -> value).
    std::vector<std::pair<std::string, double>> extra = {};
    // PromptProgress: prompt tokens decoded so far (stats.prompt_tokens is the whole prompt).
    int32_t processed = 0;
    // Token of a call with logprobs on: the token's log-probability and the top candidates.
    std::optional<TokenProbs> probs = std::nullopt;
    Origin origin = Origin::Plain;  // Token
    int32_t drafted = 0;            // Token of Origin::Target: the drafts its verify step proposed
};

// A blocking FIFO between the engine (push) and the consumer (pop with a timeout). An asyncio
// consumer sets a wake file descriptor: every push also writes one byte to it, so that the event
// loop wakes up by itself (no thread waits for it).
class EventQueue {
public:
    void push(Event ev);
    // Waits up to `timeout` for an event (zero: only looks).
    std::optional<Event> pop(std::chrono::microseconds timeout);
    // The descriptor to write a byte to at every push (-1: none). Once this returns, no write to
    // the previous descriptor is under way or will come.
    void set_wake_fd(int fd);

private:
    std::mutex mutex_;
    std::condition_variable cv_;
    std::deque<Event> events_;
    int wake_fd_ = -1;
};

// Holds back text that may be the start of a stop string; finds the earliest stop.
class StopMatcher {
public:
    explicit StopMatcher(std::vector<std::string> stops) : stops_(std::move(stops)) {}
    // Returns the text that can be emitted now; sets `stopped` when a stop string appeared (its text and
    // anything after it are dropped). With final=true nothing is held back.
    std::string process(const std::string & text, bool final, bool & stopped);
    bool holding() const { return !held_.empty(); }

private:
    std::vector<std::string> stops_;
    std::string held_;
};

struct GenRequest {
    std::vector<llama_token> prompt;
    int32_t max_tokens = 256;
    std::vector<std::string> stop;
    common_params_sampling sampling;
    std::string grammar_root = "root";
    bool prompt_progress = false;  // a PromptProgress event before the prompt and after each chunk
    int32_t draft_max = -1;        // this call's longest draft (0: none; -1: the session's n_draft)
    float p_min = -1.0f;           // this call's draft confidence threshold (-1: the session's; patch 0007)
    bool cache_prompt = true;      // reuse what the sequence's memory holds of the prompt (prompt cache)
    ProbsRequest probs;            // log-probabilities on each Token event (logprobs.h)
};

// Turns sampled token ids into Token events: valid UTF-8, stop strings, and the one-event hold-back
// that keeps held text attached to a token (see docs/architecture.md, "Text and events").
class TokenEmitter {
public:
    // preserved: tokens whose text is kept although they are control tokens (a chat template's tool-call
    // markers, ChatPrompt; common's sampling field of that name).
    TokenEmitter(const llama_vocab * vocab, EventQueue & queue, std::vector<std::string> stops,
                 std::set<llama_token> preserved = {})
        : vocab_(vocab), queue_(queue), stop_(std::move(stops)), preserved_(std::move(preserved)) {}
    // Emits a token (with its probabilities, when asked for); returns true when a stop string ended the text.
    bool token(llama_token id, bool last, std::optional<TokenProbs> probs = std::nullopt, Origin origin = Origin::Plain,
               int32_t drafted = 0);
    // The model ended by itself: release whatever is held into the last token event.
    void end_of_generation();
    // Generation stops for another reason (cancel, error): push what is deferred as it is.
    void abandon();

private:
    void push_deferred();
    const llama_vocab * vocab_;
    EventQueue & queue_;
    Utf8Decoder utf8_;
    StopMatcher stop_;
    std::set<llama_token> preserved_;
    std::optional<Event> deferred_;
};

// One generation call's state: the request, its sampler and output queue, its figures and its
// cancellation token. Shared (shared_ptr) by the Python-facing handle (Run, engine.h) and, while the
// call is admitted, by the engine that decodes it; only the engine thread touches the sampler, the
// stats and the times, the consumer only pops the queue.
struct CallState {
    CallState(GenRequest r, common_sampler_ptr s, int32_t seq_id)
        : req(std::move(r)), smpl(std::move(s)), seq(seq_id) {}
    CallState(const CallState &) = delete;
    CallState & operator=(const CallState &) = delete;

    GenRequest req;
    common_sampler_ptr smpl;
    EventQueue queue;
    GenStats stats;
    const int32_t seq;                       // the sequence this call decodes on
    Clock::time_point t_start{}, t_first{}, t_last{};
    std::atomic<bool> cancelled{false};      // this call's own token: set once, never cleared
    bool released = true;                    // guarded by the engine's mutex: not in the engine's hands

    // What the start records before the engine sees the call: start time, prompt size, seed.
    void mark_start();
    // Emits one sampled token: end-of-generation, or a Token event with the max_tokens and
    // stop-string checks and the first/last-token times. Returns the finish reason when the call is
    // over ("stop" | "length"), else nullptr.
    const char * emit(TokenEmitter & emitter, const llama_vocab * vocab, llama_token id,
                      std::optional<TokenProbs> probs = std::nullopt, Origin origin = Origin::Plain,
                      int32_t drafted = 0);
    // Sets stats.generation_s from the first and last token times.
    void close_window() { stats.generation_s = stats.tokens > 0 ? seconds(t_last - t_first) : 0.0; }
    // Pushes Done with the call's stats and extra figures.
    void finish(const char * reason, std::vector<std::pair<std::string, double>> extra = {});
    // Pushes a Failure event carrying `e`.
    void fail(const Error & e) { queue.push(Event{Event::Failure, -1, {}, stats, e}); }
};

// Reads llama_decode's result: true when the batch ran, false when a cancel aborted it; any other
// code raises DecodeError (carrying the code) naming `what`.
bool decode_ok(int rc, const char * what);

// Checks a request against a context (prompt ids, max_tokens, n_ctx); throws InvalidOption /
// ContextOverflow before anything is decoded.
void validate_request(const GenRequest & req, const Context & ctx);

// A request from the arguments of a binding's start() (sampling: the validated options dict).
GenRequest make_request(std::vector<llama_token> prompt, int32_t max_tokens, std::vector<std::string> stop,
                        const nanobind::dict & sampling, std::string grammar_root, bool prompt_progress,
                        int32_t draft_max, float p_min, bool cache_prompt, int32_t logprobs,
                        bool post_sampling_probs);

// Converts events and stats into Python objects for the bindings.
nanobind::object event_to_python(Event & ev);


}  // namespace llamaspec
