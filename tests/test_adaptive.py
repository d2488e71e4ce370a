"""n_draft="auto": the policy's behaviour on synthetic costs and acceptance (deterministic), and real
sessions that stay lossless and record the lengths they chose. No timing asserts."""

from __future__ import annotations

import random
from collections.abc import Callable

import pytest

import llamaspec
from llamaspec import MTP, InvalidOptionError, Speculative, _native
from llamaspec_fixtures import FixtureInfo

from .conftest import token_ids

N_MAX = 8
DRAFT_US = 100.0   # the drafter's time per drafted token (10% of a plain step)
SHADOW_US = 50.0   # a one-token shadow draft: 5% of a plain step (an MTP head on a small model)


def cost(batch: int) -> float:
    """A verify that costs 1 ms plus 15% per extra token (the shape measured on CPUs)."""
    return 1000.0 + 150.0 * (batch - 1)


def true_rate(k: int, p: float, draft_us: float = DRAFT_US) -> float:
    """Tokens per microsecond of length k at per-token acceptance p, with the simulated costs (the
    noise below averages 1.05)."""
    tokens = sum(p ** j for j in range(k + 1))
    return tokens / (draft_us * k + 1.05 * cost(k + 1))


def best_rate(p: float, draft_us: float = DRAFT_US) -> float:
    return max(true_rate(k, p, draft_us) for k in range(N_MAX + 1))


def drive(acceptance: Callable[[int], float], n: int = 400, seed: int = 1, shadows: list[int] | None = None,
          slowdown: Callable[[int, int], float] = lambda i, k: 1.0, draft_us: float = DRAFT_US,
          shadow_us: float = SHADOW_US, policy: _native.DraftLengthPolicy | None = None) -> list[int]:
    """Run the policy against a drafter whose tokens are accepted with the given probability; the
    steps that carried a shadow draft are appended to shadows; slowdown(step, length) multiplies a
    verify's cost (a slow spell)."""
    rng = random.Random(seed)
    policy = policy or _native.DraftLengthPolicy(N_MAX, 0)
    chosen = []
    for i in range(n):
        k = policy.choose()
        chosen.append(k)
        if k == 0 and policy.shadow:
            assert policy.shadow_length == 1
            policy.observe_shadow(True, rng.random() < acceptance(i), shadow_us)
            if shadows is not None:
                shadows.append(i)
        a = 0
        while a < k and rng.random() < acceptance(i):
            a += 1
        policy.observe(k, k, a, draft_us * k, cost(k + 1) * slowdown(i, k) * rng.uniform(0.9, 1.2))
    return chosen


def efficiency(chosen: list[int], p: float) -> float:
    """The rate of the lengths chosen, relative to the best length's (1.0: always the best)."""
    return sum(true_rate(k, p) for k in chosen) / len(chosen) / best_rate(p)


pytestmark = pytest.mark.unit


def test_policy_never_verifies_a_draft_when_nothing_is_accepted() -> None:
    shadows: list[int] = []
    chosen = drive(lambda i: 0.0, shadows=shadows)
    # acceptance is measured with shadow drafts (drafted, not verified)...
    assert chosen == [0] * len(chosen)
    # ...which come on the first steps, then within their cost budget (1% of plain decoding: 5% of a
    # plain step each, so one in 5 steps)
    assert shadows[:2] == [0, 1]
    assert 0.15 < sum(i >= 50 for i in shadows) / len(chosen[50:]) <= 0.21


def test_shadow_drafts_stay_within_their_budget() -> None:
    # a shadow draft costs 10% of a plain step, plus its catch-up: per plain step since the last one,
    # an MTP head's or a draft model's decode of that row. Watching may cost 1% of plain decoding:
    # no catch-up cost, one in 10 steps; 0.5% a row, one in 20; 15% a row, never within budget: the
    # drafter is left idle after the first few
    for per_row, lo, hi in [(0.0, 35, 45), (5.0, 17, 25), (150.0, 2, 6)]:
        policy = _native.DraftLengthPolicy(N_MAX, 0)
        shadows, last = [], 0
        for i in range(400):
            assert policy.choose() == 0
            if policy.shadow:
                shadows.append(i)
                policy.observe_shadow(True, False, 100.0 + per_row * max(0, i - last - 1))
                last = i
            policy.observe(0, 0, 0, 0.0, 1000.0)
        assert lo <= len(shadows) <= hi, (per_row, shadows)
        assert per_row < 100 or max(shadows) < 100


@pytest.mark.parametrize("seed", range(1, 4))
@pytest.mark.parametrize("p", [1.0, 0.9, 0.75, 0.5, 0.3])
def test_policy_converges_to_the_best_length(p: float, seed: int) -> None:
    # the simulated machine's best length for this acceptance (0 at 30%: plain decoding) is found
    # within 100 steps, and the lengths chosen afterwards run within 3% of it
    chosen = drive(lambda i: p, n=500, seed=seed)
    assert efficiency(chosen[100:], p) > 0.97, (p, chosen[100:160])


def test_a_drafter_that_cannot_pay_is_left_alone() -> None:
    # every draft is accepted, but a drafted token costs as much as a plain step (a draft model as
    # slow as its target): no length can pay, so none is verified, and once that is clear no shadow
    # draft is made either (a draft model would otherwise decode the text to keep up with it)
    shadows: list[int] = []
    chosen = drive(lambda i: 1.0, n=400, draft_us=1000.0, shadow_us=1000.0, shadows=shadows)
    assert chosen == [0] * 400
    assert max(shadows) < 5


@pytest.mark.parametrize("seed", range(1, 6))
@pytest.mark.parametrize("before, after", [(1.0, 0.0), (0.0, 1.0)])
def test_policy_notices_a_change_of_text(before: float, after: float, seed: int) -> None:
    chosen = drive(lambda i: before if i < 200 else after, n=500, seed=seed)
    if after == 0.0:
        # settled: 10 steps in a row plain. The drafts fail at once, but acceptance fades by 0.97 per
        # verify, so it takes a few dozen failed verifies
        settled = next(i for i in range(200, 490) if chosen[i:i + 10] == [0] * 10)
        assert settled - 200 <= 100
        assert chosen[350:].count(0) / 150 > 0.9
    else:
        # back to drafting within 60 steps (shadow drafts every 5th step see the change), at the
        # longest lengths soon after
        assert next(i for i in range(200, 500) if chosen[i] > 0) - 200 <= 60
        assert sum(k >= N_MAX - 1 for k in chosen[300:]) / 200 > 0.9


def test_one_slow_verify_does_not_move_a_known_cost() -> None:
    # a verify preempted by another process (1.5-2x) once locked a good length out for the rest of
    # a call: a length's cost is the mean of its last 8 measurements less the largest
    policy = _native.DraftLengthPolicy(N_MAX, 0)
    policy.observe(0, 0, 0, 0.0, 500.0)  # the first of each length is a warm-up, not measured
    policy.observe(0, 0, 0, 0.0, 500.0)
    for _ in range(30):
        policy.observe(4, 4, 4, 0.0, 1000.0)
    assert policy.expected_us(4) == pytest.approx(1000.0)
    policy.observe(4, 4, 4, 0.0, 5000.0)
    assert policy.expected_us(4) == pytest.approx(1000.0)
    # a lasting change is followed within the window
    for _ in range(8):
        policy.observe(4, 4, 4, 0.0, 2000.0)
    assert policy.expected_us(4) == pytest.approx(2000.0)


def test_a_length_measured_during_a_slow_spell_is_measured_again() -> None:
    # everything is accepted, so the longest draft is best, but its verifies are slow for a while
    # (another process on the core): the policy moves to a shorter length, and once the slow
    # measurements are old (512 steps) the length is estimated from its neighbours, chosen and
    # measured again
    chosen = drive(lambda i: 1.0, n=1000,
                   slowdown=lambda i, k: 1.3 if k == N_MAX and 50 <= i < 150 else 1.0)
    assert sum(k == N_MAX for k in chosen[100:150]) / 50 < 0.2  # it left the slow length...
    assert sum(k == N_MAX for k in chosen[800:]) / 200 > 0.8  # ...and came back


def test_drafting_costs_measured_in_a_slow_spell_do_not_keep_the_session_plain() -> None:
    # the first drafting verifies run 2.5x slow, so drafting looks worse than plain decoding at 75%
    # acceptance; shadow drafts only update the acceptance, so without forgetting those costs the
    # session stayed plain for good (seen once in 12 real ~75% sessions)
    chosen = drive(lambda i: 0.75, n=1000, slowdown=lambda i, k: 2.5 if k > 0 and i < 40 else 1.0)
    assert chosen[10:40].count(0) > 20  # the slow spell made it plain...
    assert efficiency(chosen[700:], 0.75) > 0.97  # ...but not for good


def test_policy_respects_n_min_and_its_model_is_monotone() -> None:
    policy = _native.DraftLengthPolicy(6, 3)
    seen = set()
    for _ in range(100):
        k = policy.choose()
        seen.add(k)
        if k == 0 and policy.shadow:
            assert policy.shadow_length == 3
            policy.observe_shadow(True, True, 3 * SHADOW_US)
        policy.observe(k, k, k, 50.0 * k, cost(k + 1))
    assert seen <= {0, 3, 4, 5, 6} and max(seen) >= 3
    assert [policy.expected_tokens(k) for k in range(7)] == sorted(policy.expected_tokens(k) for k in range(7))


@pytest.mark.parametrize("drafted", [2, 5, 8])
def test_the_model_predicts_every_length_from_the_one_drafted(drafted: int) -> None:
    # drafting one length at steady per-token acceptance p, the per-position model predicts what
    # every length yields (E(k) = sum of p^j, j <= k): on average within 5% (one estimate, from the
    # last ~33 verifies, is within ~15%); the cost of the lengths not measured is interpolated from
    # those that were
    p = 0.8
    rng = random.Random(3)
    policy = _native.DraftLengthPolicy(N_MAX, 0)
    for _ in range(3):
        policy.observe(0, 0, 0, 0.0, cost(1))
    seen = [0.0] * (N_MAX + 1)
    for i in range(400):
        a = 0
        while a < drafted and rng.random() < p:
            a += 1
        policy.observe(drafted, drafted, a, DRAFT_US * drafted, cost(drafted + 1))
        if i >= 100:
            seen = [s + policy.expected_tokens(k) / 300 for k, s in enumerate(seen)]
    for k in range(1, drafted + 1):
        assert seen[k] == pytest.approx(sum(p ** j for j in range(k + 1)), rel=0.05), k
    assert policy.expected_us(drafted) == pytest.approx(cost(drafted + 1) + DRAFT_US * drafted)
    measured = cost(drafted + 1) + DRAFT_US * drafted
    assert policy.expected_us(1) == pytest.approx(cost(1) + (measured - cost(1)) / drafted)


# ------------------------------------------------------------------------------------------------
# several sequences: one step verifies every sequence's drafts, and costs by the rows it verifies


def step_rows(lengths: list[int], equal: bool) -> int:
    """The rows a step costs: each sequence's token and draft, or on a target that splits a batch
    into equal-length pieces (recurrent and hybrid models) as if each verified the longest draft."""
    return len(lengths) * (1 + max(lengths)) if equal else sum(k + 1 for k in lengths)


def batch_rate(lengths: list[int], ps: list[float], equal: bool = False) -> float:
    """Expected tokens per microsecond of a step with these lengths at these acceptances."""
    tokens = sum(sum(p ** j for j in range(k + 1)) for k, p in zip(lengths, ps))
    return tokens / (1.05 * cost(step_rows(lengths, equal)) + DRAFT_US * max(lengths))


def drive_batch(ps: list[float], n: int = 400, seed: int = 1, equal: bool = False) -> list[list[int]]:
    rng = random.Random(seed)
    policy = _native.DraftLengthPolicy(N_MAX, 0, len(ps), equal_lengths=equal)
    seqs = list(range(len(ps)))
    chosen = []
    for _ in range(n):
        lengths = policy.choose_step(seqs)
        chosen.append(lengths)
        for seq, (k, p) in enumerate(zip(lengths, ps)):
            if k == 0 and policy.shadow_of(seq):
                policy.observe_shadow_of(seq, True, rng.random() < p, SHADOW_US)
            a = 0
            while a < k and rng.random() < p:
                a += 1
            policy.observe_draft(seq, k, k, a)
        rows = step_rows(lengths, equal)
        policy.observe_step(rows, max(lengths), DRAFT_US * max(lengths),
                            cost(rows) * rng.uniform(0.9, 1.2))
    return chosen


@pytest.mark.parametrize("seed", range(1, 4))
def test_each_sequence_gets_the_length_its_text_pays_for(seed: int) -> None:
    # one sequence's drafts are all accepted, the other's never: the first drafts long, the second
    # not at all (but when every 32nd step measures one draft token more, which goes to it)
    tail = drive_batch([1.0, 0.0], seed=seed)[100:]
    assert sum(k[0] >= N_MAX - 1 for k in tail) / len(tail) > 0.9
    assert sum(k[1] == 0 for k in tail) / len(tail) > 0.93


@pytest.mark.parametrize("seed", range(1, 4))
@pytest.mark.parametrize("ps", [[0.9, 0.7, 0.5, 0.2], [0.8, 0.8, 0.8, 0.8], [0.0, 0.0, 0.0, 0.0]])
def test_several_sequences_run_at_least_as_fast_as_the_best_fixed_length(ps: list[float], seed: int) -> None:
    # the batch's rate, summed over its sequences, is at least what the best fixed length for all of
    # them gives when their texts differ; when they are alike, one common length is the optimum and
    # the noise of each sequence's own estimate (it sees a quarter of the evidence) costs up to 5%
    tail = drive_batch(ps, seed=seed)[100:]
    rate = sum(batch_rate(k, ps) for k in tail) / len(tail)
    best_fixed = max(batch_rate([k] * len(ps), ps) for k in range(N_MAX + 1))
    assert rate / best_fixed > (0.98 if len(set(ps)) > 1 else 0.95), (rate / best_fixed, tail[:5])


@pytest.mark.parametrize("seed", range(1, 4))
@pytest.mark.parametrize("ps", [[0.95, 0.8, 0.6, 0.3], [0.8, 0.8, 0.8, 0.8]])
def test_a_target_that_splits_ragged_batches_gets_one_length_for_all(ps: list[float], seed: int) -> None:
    # a hybrid target runs a batch whose sequences verify different numbers of rows as several
    # passes: a step costs as if each sequence verified the longest draft, so the policy gives every
    # sequence that length (their extra rows are free) and matches the best fixed length
    tail = drive_batch(ps, seed=seed, equal=True)[100:]
    assert sum(len(set(k)) == 1 for k in tail) / len(tail) > 0.9, tail[:5]
    rate = sum(batch_rate(k, ps, equal=True) for k in tail) / len(tail)
    best_fixed = max(batch_rate([k] * len(ps), ps, equal=True) for k in range(N_MAX + 1))
    assert rate / best_fixed > 0.97, (rate / best_fixed, tail[:5])


def test_policy_sequence_ids_are_checked() -> None:
    policy = _native.DraftLengthPolicy(N_MAX, 0, 2)
    for bad in ([2], [-1], [0, 0]):
        with pytest.raises(InvalidOptionError):
            policy.choose_step(bad)
    with pytest.raises(InvalidOptionError):
        policy.observe_draft(2, 1, 1, 1)
    with pytest.raises(InvalidOptionError):
        policy.shadow_of(5)


def test_a_sequence_alone_is_chosen_for_as_in_a_session_of_one() -> None:
    # a session of 4 sequences with one call running behaves as a session of one sequence
    policy = _native.DraftLengthPolicy(N_MAX, 0, 4)
    rng = random.Random(5)
    chosen = []
    for _ in range(300):
        (k,) = policy.choose_step([2])
        chosen.append(k)
        if k == 0 and policy.shadow_of(2):
            policy.observe_shadow_of(2, True, rng.random() < 0.75, SHADOW_US)
        a = 0
        while a < k and rng.random() < 0.75:
            a += 1
        policy.observe_draft(2, k, k, a)
        policy.observe_step(k + 1, k, DRAFT_US * k, cost(k + 1) * rng.uniform(0.9, 1.2))
    assert efficiency(chosen[100:], 0.75) > 0.97
    assert not policy.shadow_of(0) and policy.expected_tokens(3, seq=0) == policy.expected_tokens(3, seq=1)


# ------------------------------------------------------------------------------------------------
# real sessions

@pytest.mark.fixture
@pytest.mark.parametrize("level", ["100", "74", "0"])
def test_auto_is_lossless_and_records_its_lengths(fx_mtp_levels: dict[str, FixtureInfo], level: str) -> None:
    info = fx_mtp_levels[level]
    with llamaspec.Model(info.path) as m, llamaspec.Generator(m, n_ctx=1024, n_threads=1) as plain, \
            MTP(m, n_draft="auto", n_draft_max=6, n_ctx=1024, n_threads=1) as auto:
        assert auto.adaptive and auto.n_draft == "auto" and auto.n_draft_max == 6 and "auto" in repr(auto)
        for prompt, n in (("hello", 300), (m.detokenize(info.cycle[3:9]), 120), ("x", 1), ("y", 2)):
            want = token_ids(plain.stream_events(prompt, n, temperature=0))
            got = token_ids(auto.stream_events(prompt, n, temperature=0))
            assert got == want, (level, prompt, n)
        st = auto.stats()
        assert st.adaptive and len(st.draft_length_histogram) == 7
        assert sum(st.draft_length_histogram) == st.iterations
        assert st.drafts_generated <= sum(k * c for k, c in enumerate(st.draft_length_histogram))
        assert 0.0 <= st.mean_draft_length <= 6
        assert 0 < st.shadow_drafts <= st.draft_length_histogram[0]
        if level == "0":
            # the shadow drafts show that nothing would be accepted: no draft is ever verified
            # (whatever the machine's costs: with only plain steps measured, the choice is relative)
            assert st.drafts_generated == 0 and st.shadow_accepted == 0
            assert st.draft_length_histogram[0] == st.iterations
        if level == "100":  # all but the first token after an arbitrary prompt are predicted
            assert st.shadow_accepted >= st.shadow_drafts - 1 and st.drafts_accepted >= st.drafts_generated - 1


@pytest.mark.fixture
def test_fixed_lengths_record_their_histogram_too(fx: llamaspec.Model) -> None:
    with MTP(fx, n_draft=3, n_ctx=256, n_threads=1) as mtp:
        mtp.generate("hello", 40, temperature=0)
        st = mtp.stats()
        assert not st.adaptive and len(st.draft_length_histogram) == 4
        assert sum(st.draft_length_histogram) == st.iterations
        assert st.draft_length_histogram[3] == st.iterations - sum(st.draft_length_histogram[:3])


@pytest.mark.fixture
def test_auto_with_ngram_and_sampling(fx_nomtp_info: FixtureInfo) -> None:
    with llamaspec.Model(fx_nomtp_info.path) as m, llamaspec.Generator(m, n_ctx=1024, n_threads=1) as g, \
            Speculative(m, method="ngram-mod", n_draft="auto", ngram_options={"n_match": 4}, n_ctx=1024,
                        n_threads=1) as spec:
        assert spec.generate("hello", 400, temperature=0) == g.generate("hello", 400, temperature=0)
        kw = dict(temperature=5.0, top_k=0, top_p=1.0, min_p=0.0, seed=3)
        assert spec.generate("hello", 200, **kw) == g.generate("hello", 200, **kw)


@pytest.mark.fixture
@pytest.mark.parametrize("level", ["100", "74"])
def test_auto_with_several_sequences_is_lossless(fx_mtp_levels: dict[str, FixtureInfo], level: str) -> None:
    # the policy chooses every sequence's length of a step together; output stays what plain
    # decoding gives, greedy and seeded, whatever it chooses
    info = fx_mtp_levels[level]
    with llamaspec.Model(info.path) as m, llamaspec.Generator(m, n_ctx=512, n_threads=1) as plain, \
            MTP(m, n_draft="auto", n_draft_max=6, n_ctx=512, n_threads=1, n_seq=3) as auto:
        prompts = ["hello", m.detokenize(info.cycle[3:9]), "xyz", "ab", m.detokenize(info.cycle[:4])]
        want = [plain.generate(p, 150, temperature=0) for p in prompts]
        assert auto.generate_batch(prompts, 150, temperature=0) == want
        kw = dict(temperature=1.5, top_k=0, top_p=1.0, min_p=0.0, seed=11)
        assert auto.generate_batch(prompts[:3], 100, **kw) == [plain.generate(p, 100, **kw) for p in prompts[:3]]
        st = auto.stats()
        assert st.adaptive and sum(st.draft_length_histogram) == st.iterations
        assert st.passes < st.iterations  # the sequences shared their passes
        if level == "100":
            assert st.shadow_drafts > 0 and st.shadow_accepted >= st.shadow_drafts - len(prompts) - 3


@pytest.mark.fixture
def test_auto_options_are_checked(fx: llamaspec.Model) -> None:
    with pytest.raises(InvalidOptionError, match="n_draft_max"):
        MTP(fx, n_draft="auto", n_draft_max=0)
    with pytest.raises(InvalidOptionError, match="n_draft_max applies"):
        MTP(fx, n_draft=3, n_draft_max=5)
    with pytest.raises(InvalidOptionError, match="n_draft"):
        MTP(fx, n_draft="fast")  # type: ignore[arg-type]
    with MTP(fx, n_draft="auto", n_ctx=256, n_threads=1) as auto:
        assert auto.n_draft == "auto" and auto.n_draft_max == 8  # the default maximum


@pytest.mark.fixture
def test_auto_is_the_default_and_lossless(fx_mtp_levels: dict[str, FixtureInfo]) -> None:
    # a session built without n_draft chooses its lengths, up to its method's default maximum, and
    # its output is plain decoding's, greedy and seeded
    info = fx_mtp_levels["74"]
    with llamaspec.Model(info.path) as m, llamaspec.Generator(m, n_ctx=512, n_threads=1) as plain, \
            MTP(m, n_ctx=512, n_threads=1) as mtp, \
            Speculative(m, method=["ngram-mod", "mtp"], n_ctx=512, n_threads=1) as chain:
        assert mtp.n_draft == "auto" and mtp.n_draft_max == llamaspec.DEFAULT_N_DRAFT_MAX["draft-mtp"]
        assert chain.n_draft == "auto" and chain.n_draft_max == max(
            llamaspec.DEFAULT_N_DRAFT_MAX[x] for x in ("ngram-mod", "draft-mtp"))
        prompt = m.detokenize(info.cycle[:8])
        kw = dict(temperature=1.5, top_k=0, top_p=1.0, min_p=0.0, seed=5)
        for session in (mtp, chain):
            assert session.generate(prompt, 200, temperature=0) == plain.generate(prompt, 200, temperature=0)
            assert session.generate(prompt, 120, **kw) == plain.generate(prompt, 120, **kw)
            assert session.stats().adaptive


@pytest.mark.fixture
def test_plain_steps_do_not_decode_the_mtp_head(fx_mtp_levels: dict[str, FixtureInfo]) -> None:
    """Patch 0005: the MTP head's catch-up decode is deferred to the next draft, so an auto session
    at 0% (plain steps, shadow drafts now and then) decodes on its MTP context about twice per
    shadow draft (the catch-up of the rows since the last one, the one-token draft) instead of once
    per token; before the patch every plain step was one MTP decode. (On this fixture the head is a
    large part of the model, so catching it up costs far more than the policy's budget for watching:
    after the first few shadow drafts it is left idle.)"""
    info = fx_mtp_levels["0"]
    with llamaspec.Model(info.path) as m, MTP(m, n_draft="auto", n_ctx=1024, n_threads=1, no_perf=False) as auto:
        auto.generate(m.detokenize(info.cycle[:8]), 400, temperature=0)
        st = auto.stats()
        assert st.drafts_generated == 0 and st.iterations >= 399
        draft_ctx = auto._engine.draft
        assert draft_ctx is not None
        perf = draft_ctx.perf()
        # single-token decodes: one-token drafts and one-row catch-ups; longer catch-ups count as prompt tokens
        assert perf["eval_runs"] <= 2 * st.shadow_drafts
