// Plain (non-speculative) generation: a C++ worker thread runs prefill + decode + sample with the GIL
// released and hands finished pieces to Python through an EventQueue.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <nanobind/nanobind.h>

#include "common.h"    // common
#include "sampling.h"  // common
#include "context.h"
#include "errors.h"
#include "utf8.h"

namespace llamaspec {

using Clock = std::chrono::steady_clock;

double seconds(Clock::duration d);

// Sampling options from the dict the Python face validated. Throws Error(InvalidOption).
common_params_sampling sampling_params_from_dict(const nanobind::dict & options);

// Builds the sampler; an invalid grammar raises Error(Grammar) naming the problem. Without the GIL.
common_sampler_ptr make_sampler(const Model & model, common_params_sampling params, const std::string & grammar_root);

struct GenStats {
    int32_t prompt_tokens = 0;
    int32_t tokens = 0;
    double prefill_s = 0;     // decoding the prompt
    double ttft_s = 0;        // start of the call to the first token
    double generation_s = 0;  // first to last token
    double total_s = 0;
    std::string finish_reason = "length";  // "stop" | "length" | "cancelled"
    uint32_t seed = 0;

    double tokens_per_second() const { return tokens > 1 && generation_s > 0 ? (tokens - 1) / generation_s : 0.0; }
};

struct Event {
    enum Kind { Token = 0, EndOfGeneration = 1, Done = 2, Failure = 3 };
    Kind kind;
    llama_token id = -1;
    std::string text;
    GenStats stats;
    std::optional<Error> error;
    // Done of a speculative run: the call's speculative counts (name -> value).
    std::vector<std::pair<std::string, double>> extra = {};
};

// A blocking FIFO between the worker (push) and the consumer (pop with a timeout).
class EventQueue {
public:
    void push(Event ev);
    // Waits up to `timeout` for an event.
    std::optional<Event> pop(std::chrono::microseconds timeout);

private:
    std::mutex mutex_;
    std::condition_variable cv_;
    std::deque<Event> events_;
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
};

// Turns sampled token ids into Token events: valid UTF-8, stop strings, and the one-event hold-back
// that keeps held text attached to a token (see docs/architecture.md, "Text and events").
class TokenEmitter {
public:
    TokenEmitter(const llama_vocab * vocab, EventQueue & queue, std::vector<std::string> stops)
        : vocab_(vocab), queue_(queue), stop_(std::move(stops)) {}
    // Emits a token; returns true when a stop string ended the text.
    bool token(llama_token id, bool last);
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
    std::optional<Event> deferred_;
};

class Run;
class PlainRun;

// The engine behind llamaspec.Generator: owns a Context and allows one Run at a time.
class Generator {
public:
    explicit Generator(std::shared_ptr<Context> ctx) : ctx_(std::move(ctx)), busy_(std::make_shared<std::atomic<bool>>(false)) {}
    // Validates the request, builds the sampler and starts the worker. Throws Busy, ContextOverflow,
    // InvalidOption, Grammar. Call without the GIL.
    std::shared_ptr<Run> start(GenRequest req);
    const std::shared_ptr<Context> & context() const { return ctx_; }
    bool busy() const { return busy_->load(); }

private:
    std::shared_ptr<Context> ctx_;
    std::shared_ptr<std::atomic<bool>> busy_;
};

// One generation call. Ownership: holds the Context (so the llama_context outlives the worker) and the
// engine's busy flag, which it clears on close(). The consumer must call close() (the Python face
// does in every exit path); the destructor closes too. Subclasses implement work(): the loop that
// runs on the worker thread and pushes events (PlainRun here, SpecRun in speculative.cpp).
class Run {
public:
    Run(std::shared_ptr<Context> ctx, std::shared_ptr<std::atomic<bool>> busy, GenRequest req, common_sampler_ptr smpl);
    virtual ~Run();
    Run(const Run &) = delete;
    Run & operator=(const Run &) = delete;

    // Starts the work: a worker thread running work() (or, for a sequence of a multi-sequence
    // session, hands it to the session's engine).
    virtual void launch();
    // Next event, or nullopt after `timeout` (negative: wait forever).
    std::optional<Event> next(std::chrono::microseconds timeout) { return queue_.pop(timeout); }
    // Asks the worker to stop at the next step, or at the next graph node inside a decode.
    virtual void cancel();
    // cancel() + join the worker + release the engine. Idempotent. Call without the GIL.
    void close();
    // The sequence id this call decodes on (0 but for multi-sequence sessions).
    virtual int32_t seq() const { return 0; }
    bool closed() const { return closed_; }

protected:
    virtual void work() = 0;
    // Waits until nothing works for this call any more (close() after cancel()): joins the worker
    // thread and clears the context's abort flag.
    virtual void join_worker();
    // What launch() records before the work starts: start time, prompt size, seed.
    void mark_start();
    // Pushes Done with the call's stats (and a subclass's extra figures).
    void finish(GenStats & stats, const char * reason, std::vector<std::pair<std::string, double>> extra = {});
    bool cancelled() const { return cancel_.load(std::memory_order_relaxed); }
    // Sets the cancel flag only (no abort of a decode in flight).
    void flag_cancel() { cancel_.store(true); }
    // Runs work() and turns an exception into a Failure event.
    void guarded_work();
    // Emits one sampled token: end-of-generation, or a Token event with the max_tokens and
    // stop-string checks and the first/last-token times. Returns the finish reason when the call is
    // over ("stop" | "length"), else nullptr.
    const char * emit(TokenEmitter & emitter, llama_token id);
    // Reads llama_decode's result: true when the batch ran, false when a cancel aborted it; any other
    // code raises DecodeError (carrying the code) naming `what`.
    static bool decode_ok(int rc, const char * what);
    // Sets stats_.generation_s from the first and last token times.
    void close_window() { stats_.generation_s = stats_.tokens > 0 ? seconds(t_last_ - t_first_) : 0.0; }

    std::shared_ptr<Context> ctx_;
    std::shared_ptr<std::atomic<bool>> busy_;
    GenRequest req_;
    common_sampler_ptr smpl_;
    EventQueue queue_;
    Clock::time_point t_start_, t_first_{}, t_last_{};
    GenStats stats_;

private:
    std::thread worker_;
    std::atomic<bool> cancel_{false};
    std::mutex close_mutex_;
    bool closed_ = false;
};

// The plain loop: prefill, then sample / emit / decode one token at a time.
class PlainRun final : public Run {
public:
    using Run::Run;
    ~PlainRun() override { close(); }  // join before this object's parts go (see ~Run)

protected:
    void work() override;
};

// Checks a request against a context (prompt ids, max_tokens, n_ctx); throws InvalidOption /
// ContextOverflow before anything is decoded.
void validate_request(const GenRequest & req, const Context & ctx);

// A request from the arguments of a binding's start() (sampling: the validated options dict).
GenRequest make_request(std::vector<llama_token> prompt, int32_t max_tokens, std::vector<std::string> stop,
                        const nanobind::dict & sampling, std::string grammar_root);

// The common start of every engine: validate, claim the busy flag (BusyError if taken), build the
// sampler (GrammarError), construct RunT(owner, busy, req, sampler) and launch its worker. The flag
// is given back if anything fails before the worker runs.
template <typename RunT, typename Owner>
std::shared_ptr<Run> start_run(const Context & ctx, const std::shared_ptr<std::atomic<bool>> & busy, GenRequest req,
                               const char * what, Owner owner) {
    validate_request(req, ctx);
    if (busy->exchange(true)) {
        throw Error(ErrorKind::Busy, std::string("a generation is already running on this ") + what + " (one at a time)");
    }
    try {
        common_sampler_ptr smpl = make_sampler(*ctx.model(), req.sampling, req.grammar_root);
        auto run = std::make_shared<RunT>(std::move(owner), busy, std::move(req), std::move(smpl));
        run->launch();
        return run;
    } catch (...) {
        busy->store(false);
        throw;
    }
}

void register_generator(nanobind::module_ & m);

}  // namespace llamaspec
