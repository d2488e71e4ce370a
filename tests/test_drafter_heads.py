"""EAGLE-3, DFlash and DSpark drafter heads, with tiny hand-built drafters whose drafts are known:
lossless, acceptance as constructed, and the contract checks that keep llama.cpp from aborting."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path

import pytest

import llamaspec
from llamaspec import Speculative, UnsupportedModelError
from llamaspec_fixtures import (
    DrafterInfo,
    FixtureInfo,
    write_dflash_fixture,
    write_dspark_fixture,
    write_eagle3_fixture,
)

from .conftest import token_ids

pytestmark = pytest.mark.fixture

WRITERS: dict[str, Callable[..., DrafterInfo]] = {
    "eagle3": write_eagle3_fixture,
    "dflash": write_dflash_fixture,
    "dspark": write_dspark_fixture,
}



@pytest.fixture(scope="module")
def target(fx_nomtp_info: FixtureInfo) -> object:
    with llamaspec.Model(fx_nomtp_info.path) as m:
        yield m


@pytest.mark.parametrize("kind", list(WRITERS))
@pytest.mark.parametrize("wrong", [0.0, 0.3, 1.0])
def test_drafter_head_is_lossless_with_known_acceptance(target: llamaspec.Model, fx_nomtp_info: FixtureInfo,
                                                        fixture_dir: Path, kind: str, wrong: float) -> None:
    info = WRITERS[kind](fixture_dir / f"{kind}-{wrong}.gguf", fx_nomtp_info, wrong_fraction=wrong)
    prompts = ["hello", "ab", target.detokenize(fx_nomtp_info.cycle[30:36])]  # the cycle prompt last
    with llamaspec.Generator(target, n_ctx=512, n_threads=1) as plain:
        expected = {(p, n): token_ids(list(plain.stream_events(p, n, temperature=0)))
                    for p in prompts for n in (1, 2, 9, 100)}
    with llamaspec.Model(info.path) as dm:
        for n_draft in (1, 3, 4):
            with Speculative(target, method=kind, draft_model=dm, n_draft=n_draft, n_ctx=512,
                             n_threads=1) as spec:
                assert spec.methods == (f"draft-{kind}",)
                for (p, n), want in expected.items():
                    spec.reset_stats()
                    # the same prompts again and again: from the prompt cache, with the drafts as
                    # constructed (the drafters' state comes back with the checkpoints)
                    got = token_ids(list(spec.stream_events(p, n, temperature=0)))
                    assert got == want, (kind, wrong, p, n, n_draft)
                    st = spec.stats()
                    predicted = info.simulate(target.tokenize(p), n_draft, n)
                    assert (st.iterations, st.drafts_generated, st.drafts_accepted) == predicted, (p, n, n_draft)
                    assert st.stages[0].drafts_generated == st.drafts_generated
        # the cycle prompt, n_draft 4, 100 tokens: what each construction gives
        if wrong == 0.0 and kind in ("eagle3", "dspark"):
            assert st.acceptance_rate == 1.0
        if wrong == 0.0 and kind == "dflash":  # every draft is next(id_last): one accepted per drafted verify
            drafted = st.iterations - st.draft_length_histogram[0]
            assert st.drafts_accepted == drafted and st.accepted_per_position[1:] == (0, 0, 0)
        if wrong == 1.0:
            assert st.drafts_accepted == 0 < st.drafts_generated


def test_drafter_files_must_match_their_method(target: llamaspec.Model, fx_nomtp_info: FixtureInfo,
                                               fixture_dir: Path) -> None:
    eagle = write_eagle3_fixture(fixture_dir / "e3.gguf", fx_nomtp_info)
    dflash = write_dflash_fixture(fixture_dir / "df.gguf", fx_nomtp_info)
    cases = [
        ("draft", eagle.path, "not a standalone model; use method='eagle3'"),
        ("draft", dflash.path, "not a standalone model"),
        ("dflash", eagle.path, "is not a DFlash drafter"),
        ("eagle3", dflash.path, "is not an EAGLE-3 drafter"),
        ("dspark", dflash.path, "is not a DSpark drafter"),  # a DFlash file has no Markov head
    ]
    for method, path, msg in cases:
        with pytest.raises(UnsupportedModelError, match=msg) as ei:
            Speculative(target, method=method, draft_model=path)
        assert ei.value.path == path


def test_p_min_needs_a_dspark_confidence_head(target: llamaspec.Model, fx_nomtp_info: FixtureInfo,
                                              fixture_dir: Path) -> None:
    """Upstream throws at init for this; the error was classified by a substring of its text. It is
    checked first now, from the drafter's metadata, and raised as InvalidOptionError."""
    plain = write_dspark_fixture(fixture_dir / "ds-noconf.gguf", fx_nomtp_info, confidence_head=False)
    with pytest.raises(llamaspec.InvalidOptionError, match="confidence head.*use p_min=0") as ei:
        Speculative(target, method="dspark", draft_model=plain.path, p_min=0.5)
    assert ei.value.path == plain.path
    with Speculative(target, method="dspark", draft_model=plain.path, p_min=0.0) as spec:  # p_min 0 needs none
        assert spec.generate(target.detokenize(fx_nomtp_info.cycle[:8]), 8, temperature=0)


@pytest.mark.parametrize("kind", list(WRITERS))
def test_drafter_made_for_another_target_is_refused(target: llamaspec.Model, fx_nomtp_info: FixtureInfo,
                                                    fixture_dir: Path, kind: str) -> None:
    # drafters written for a deeper and for a wider target than the TINY one: llama.cpp would abort
    # (GGML_ASSERT / GGML_ABORT) on either, so the contract is checked before anything is built
    deeper = dataclasses.replace(fx_nomtp_info, spec=dataclasses.replace(fx_nomtp_info.spec, n_trunk=8))
    deep = WRITERS[kind](fixture_dir / f"{kind}-deep.gguf", deeper, target_layers=(0, 2, 7))
    with pytest.raises(UnsupportedModelError, match="reads target layer 7 but the target has 4 layers"):
        Speculative(target, method=kind, draft_model=deep.path)
    wider = dataclasses.replace(fx_nomtp_info, spec=dataclasses.replace(fx_nomtp_info.spec, n_embd=384))
    wide = WRITERS[kind](fixture_dir / f"{kind}-wide.gguf", wider)
    msg = "target hidden states of width 384" if kind == "eagle3" else "width 384 differs"
    with pytest.raises(UnsupportedModelError, match=msg):
        Speculative(target, method=kind, draft_model=wide.path)


@pytest.mark.parametrize("kind", ["mtp", "eagle3"])
def test_a_shorter_draft_decodes_only_what_it_asks_for(fx_info: FixtureInfo, fx_nomtp_info: FixtureInfo,
                                                        fixture_dir: Path, kind: str) -> None:
    """Patch 0004: upstream's MTP and EAGLE-3 drafters ran their configured n_max steps and cut the
    draft afterwards; a draft asked to be shorter (the last tokens of a call, n_draft="auto") now
    decodes only its own length on the draft context."""
    if kind == "mtp":
        model = llamaspec.Model(fx_info.path)
        head, info = None, fx_info
    else:
        model = llamaspec.Model(fx_nomtp_info.path)
        info = fx_nomtp_info
        head = llamaspec.Model(write_eagle3_fixture(fixture_dir / "e3-0.0.gguf", fx_nomtp_info).path)
    try:
        with Speculative(model, method=kind, draft_model=head, n_draft=8, n_ctx=256, n_threads=1,
                         no_perf=False) as spec:
            prompt = model.detokenize(info.cycle[:8])
            # the first pass drafts nothing (ADR 0014); the second asks for 5 - 1 - 1 = 3 drafts
            spec.generate(prompt, 5, temperature=0)
            assert spec.stats().draft_length_histogram[3] == 1
            draft_ctx = spec._engine.draft
            assert draft_ctx is not None
            # one draft step per token (without the patch: 8). EAGLE-3's first step runs in one
            # multi-row batch with its catch-up on the prompt, which llama.cpp counts as a prompt
            # evaluation: 2 single-row runs. The MTP head decodes its deferred catch-up (patch 0005)
            # as a batch of its own before the first step: 3.
            expected = 3 if kind == "mtp" else 2
            assert draft_ctx.perf()["eval_runs"] == expected, draft_ctx.perf()
    finally:
        model.close()
        if head is not None:
            head.close()
