"""``recs evaluate`` end to end on a small edge file: the real pipeline, the read path, the
baselines, the report files; and the product, uncapped and ranked by Adamic-Adar alone, scoring
what the Adamic-Adar baseline scores on the same split."""

from __future__ import annotations

import json

import numpy as np
import pytest

pytestmark = pytest.mark.slow


@pytest.fixture
def edge_file(tmp_path, monkeypatch):
    """120 accounts, each following 12 others: half of them among the ten 'popular' accounts
    0-9, half uniformly (seeded), tab-separated 'follower followee'. One split, no repeats."""
    monkeypatch.setenv("RECS_EVAL_MIN_TEST_USERS", "1")
    rng = np.random.default_rng(13)
    lines = []
    for follower in range(120):
        popular = rng.choice([a for a in range(10) if a != follower], 6, replace=False)
        others = [a for a in range(10, 120) if a != follower]
        rest = rng.choice(others, 6, replace=False)
        lines += [f"{follower}\t{followee}" for followee in [*popular, *rest]]
    path = tmp_path / "follows.tsv"
    path.write_text("\n".join(lines) + "\n")
    return path


def test_evaluate_writes_the_report_and_every_test_user_gets_a_list(recs, edge_file, tmp_path):
    out = tmp_path / "out"
    code, stdout, err = recs(
        "evaluate", "--edges", str(edge_file), "--variants", "design,shipped",
        "--baselines", "common_neighbours,adamic_adar,global_popularity", "--out", str(out),
        "--json",
    )
    assert code == 0, err
    (result,) = json.loads(stdout)
    assert {p.name for p in out.iterdir()} == {"results.json", "report.md", "recall.png"}
    methods = {m["name"]: m for m in result["methods"]}
    assert set(methods) == {"design", "shipped", "common_neighbours", "adamic_adar",
                            "global_popularity"}
    # every account follows 12 >= 10: all 120 are test users, round(1.2) = 1 hidden each
    assert (result["split"]["split"], result["split"]["repeats"]) == ("random", 1)
    assert methods["shipped"]["users"] == result["split"]["pooled_test_users"]
    assert methods["shipped"]["user_coverage"] == 1.0
    # the ranking changes what is counted, not how far the traversal goes
    assert methods["shipped"]["traversals_per_user"] == methods["design"]["traversals_per_user"]
    assert "| **shipped** |" in (out / "report.md").read_text()


def test_uncapped_adamic_adar_product_equals_the_baseline(recs, edge_file, monkeypatch):
    """Caps above every degree, no popularity or activity weight, no saturation, no top-up: the
    product's ranking is the Adamic-Adar baseline's (log base and scale do not change an
    order), so its recall is the baseline's on the same split."""
    for name, value in {
        "RECS_HOP1_CAP": "100000", "RECS_HOP2_CAP": "100000",
        "RECS_MAX_CANDIDATES_TO_SCORE": "100000", "RECS_POPULARITY_WEIGHT": "0",
        "RECS_ACTIVITY_WEIGHT": "0", "RECS_MUTUAL_WEIGHT": "1",
        "RECS_MUTUAL_SATURATION": "1e9", "RECS_FILL_SHORT_LISTS": "false",
    }.items():
        monkeypatch.setenv(name, value)
    code, stdout, err = recs(
        "evaluate", "--edges", str(edge_file), "--variants", "shipped", "--baselines",
        "adamic_adar", "--json",
    )
    assert code == 0, err
    (result,) = json.loads(stdout)
    methods = {m["name"]: m for m in result["methods"]}
    assert methods["shipped"]["recall"] == pytest.approx(methods["adamic_adar"]["recall"])


def test_an_unknown_variant_is_one_line(recs, edge_file):
    code, _, err = recs("evaluate", "--edges", str(edge_file), "--variants", "nope")
    assert code != 0
    assert err[-1].startswith("recs: error: unknown variant 'nope'")


@pytest.mark.parametrize(
    ("options", "error"),
    [
        (["--dataset", "slashdot", "--dataset", "bogus"], "unknown dataset 'bogus'"),
        (["--activity", "bogus"], "unknown activity 'bogus': auto, uniform or edges"),
        (["--split", "bogus"], "unknown split 'bogus': auto, random or temporal"),
        (["--min-follows", "-5"], "min follows must be at least 2, not -5"),
        (["--variants", ""], "no variant named: leave the option out for all of them"),
        (["--baselines", " , "], "no baseline named: leave the option out for all of them"),
        (["--baselines", "adamic_adar,nope"], "unknown baseline 'nope'"),
    ],
)
def test_options_no_evaluation_can_run_with_are_refused_before_any_work(
    recs, edge_file, options, error
):
    """(From a newcomer: a second --dataset that does not exist was found after the first had
    been evaluated, --activity bogus after the split and five baselines; --min-follows -5 ran as
    0 and --variants '' ran all 18.) One line, exit 2, and no progress line before it."""
    edges = [] if options[0] == "--dataset" else ["--edges", str(edge_file)]
    code, _, err = recs("evaluate", *edges, *options)
    assert code == 2 and err[-1].startswith(f"recs: error: {error}"), err
    assert not any(line.startswith("→") for line in err), err
