"""The state preset's claims (study/state.py): verdicts from the numbers, every seed and the spread
in the measured text, untested only when no row involved left its guessing level."""

from __future__ import annotations

from tokenmix.runs.synthetic import CurriculumPhase
from tokenmix.study.presets import get_preset
from tokenmix.study.state import A5, DELTA, DELTA_NEG, PARITY, PATH, PRODUCT, state_findings


def _results(accs: dict[tuple[str, str], list[float]], rising: set = frozenset()):
    out = []
    for (label, column), seeds in accs.items():
        for seed, a in enumerate(seeds):
            out.append(
                {
                    "label": label,
                    "task": "state_tracking",
                    "column": column,
                    "d_model": 32,
                    "lr": 1e-3,
                    "seed": seed,
                    "test_acc": a,
                    "best_val_acc": a,
                    "tokens_per_s": 1.0,
                    "train_seconds": 1.0,
                    "steps_done": 100,
                    "stop_reason": "max_steps",
                    "still_rising": (label, column) in rising,
                    "config": {"train": {"steps": 100}},
                    "test_acc_at": {"64": a - 0.1},
                }
            )
    return out


def _by_claim(findings):
    return {f["claim"].split(" (")[0]: f for f in findings}


def test_state_claims_follow_the_numbers():
    configs = get_preset("compare", "state").build()
    accs = {
        (DELTA_NEG, PARITY): [1.0, 1.0, 0.99],
        (DELTA, PARITY): [0.8, 0.7, 0.9],
        ("mamba2", PARITY): [0.85] * 3,
        (PRODUCT.format(1), A5): [0.08] * 3,
        (PRODUCT.format(2), A5): [0.95, 0.97, 0.93],
        (PRODUCT.format(3), A5): [0.5, 0.6, 0.7],
        (PATH, A5): [0.081, 0.079, 0.08],
    }
    f = _by_claim(state_findings(configs, _results(accs, rising={(PRODUCT.format(3), A5)})))
    parity = f["negative eigenvalues let Gated DeltaNet track parity"]
    assert parity["verdict"] == "holds" and "seeds 100.0, 100.0, 99.0; @64: 89.7" in parity["measured"]
    assert f["DeltaProduct with n_h = 2 tracks A5"]["verdict"] == "holds"
    three = f["DeltaProduct with n_h = 3 tracks A5"]
    assert three["verdict"] == "does not hold" and three["still_rising"] == [PRODUCT.format(3)]
    # PaTH never left A5's guessing level (1/16 + 15/16 x 1/60 = 7.8 %): untested, said why
    path = f["PaTH tracks A5"]
    assert path["verdict"] == "untested" and "never left the guessing level" in " | ".join(path["why"])
    accs[(PRODUCT.format(1), A5)] = [0.96] * 3
    f = _by_claim(state_findings(configs, _results(accs)))
    assert f["DeltaProduct with n_h = 2 tracks A5"]["verdict"] == "does not hold"  # not above n_h = 1


def test_every_row_gets_the_length_curriculum_on_a5_only():
    configs = get_preset("compare", "state").build()
    on_a5 = [r.train.curriculum for r in configs if r.column == A5]
    assert on_a5 and all(c == (CurriculumPhase(1000, task_args={"seq_len": 8}),) for c in on_a5)
    assert all(not r.train.curriculum for r in configs if r.column == PARITY)
    assert {r.label for r in configs if r.column == A5} == {r.label for r in configs if r.column == PARITY}
