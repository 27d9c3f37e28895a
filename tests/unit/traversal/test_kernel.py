"""The compiled flow (recs.traversal.kernel): scratch reuse, memory, per-stage counts.

Fixtures: ``traversal_fixtures``.
"""

from __future__ import annotations

import numpy as np
from traversal_fixtures import Fixture, User, build_graph, rows, run, settings_for, write_run


def test_kernel_scratch_is_reset_between_users(tmp_path):
    """Users 1 and 2 both follow 10 and 11, which both follow 20: each gets 20 with exactly
    2 mutuals (a leaked count would give user 2 four). User 2 also follows 20, so only user
    1 gets it; user 2 instead gets nothing."""
    edges = [(u, f, "active") for u in (1, 2) for f in (10, 11)]
    edges += [(10, 20, "active"), (11, 20, "active"), (2, 20, "active")]
    users = [User(1), User(2)] + [User(i, eligible=False) for i in (10, 11, 20)]
    frame = run(Fixture(users=users, edges=edges), settings_for(tmp_path))[2]
    assert [(r[0], r[1], r[2]) for r in rows(frame)] == [(1, 20, 2)]
    users = [User(1), User(3)] + [User(i, eligible=False) for i in (10, 11, 20)]
    edges = [(u, f, "active") for u in (1, 3) for f in (10, 11)]
    edges += [(10, 20, "active"), (11, 20, "active")]
    frame = run(Fixture(users=users, edges=edges), settings_for(tmp_path / "b"))[2]
    assert [(r[0], r[1], r[2]) for r in rows(frame)] == [(1, 20, 2), (3, 20, 2)]
    assert np.all(frame["rank"].to_numpy() == 1)


def test_kernel_memory_does_not_grow_with_the_graph():
    """One user follows accounts 0 and 1, which both follow 2 and 3 (2 mutuals each, so two
    rows). Its scratch is sized by its own bound (2 rows of 2 + itself = 5 -> a 16-slot table)
    and the output by its users, never by the graph: the traced peak of recommend_users is
    the same within 64 KB on graphs of 10 and 4,000,000 accounts (a dense int32 counter over
    the accounts would add 16 MB)."""
    import tracemalloc
    from types import SimpleNamespace

    from recs.config import Settings
    from recs.traversal.inputs import ShardInputs
    from recs.traversal.kernel import recommend_users
    from recs.traversal.predicates import recommendable_bits

    inputs = ShardInputs(
        user_ids=np.array([100]), user_dense=np.array([-1], np.int32),
        hop1_ptr=np.array([0, 2]), hop1_nodes=np.array([0, 1], np.int32),
        excl_ptr=np.array([0, 0]), excl_nodes=np.zeros(0, np.int32),
        excl_reasons=np.zeros(0, np.uint8),
    )
    peaks = []
    for n_nodes in (10, 4_000_000):
        indptr = np.full(n_nodes + 1, 4, dtype=np.int64)
        indptr[:2] = [0, 2]
        graph = SimpleNamespace(
            indptr=indptr, indices=np.array([2, 3, 2, 3], np.int32),
            activity=np.ones(n_nodes), n_nodes=n_nodes, path_weight=np.ones(n_nodes),
            in_degree=np.zeros(n_nodes, np.int32),
            recommendable=recommendable_bits(np.ones(n_nodes)),  # the graph's, as mapped
        )
        recommend_users(inputs, graph, Settings())  # compile / load outside the trace
        tracemalloc.start()
        result = recommend_users(inputs, graph, Settings())
        peaks.append(tracemalloc.get_traced_memory()[1])
        tracemalloc.stop()
        assert result.rows.candidate.tolist() == [2, 3]
        assert result.rows.mutual_count.tolist() == [2, 2]
    assert abs(peaks[1] - peaks[0]) < 64 * 1024, peaks


def random_run(tmp_path, seed: int = 5, n_users: int = 400, **overrides):
    """A random graph with every kind of drop: pending follows, exclusions of every reason (and
    an unnamed one), suspended, undiscoverable and profile-less accounts; small caps, a small
    max_candidates_to_score and top_k, so every stage cuts something; ``overrides`` on the
    settings."""
    rng = np.random.default_rng(seed)
    ids = list(range(1, n_users + 1))
    edges = {
        (int(f), int(t)): "active" if rng.random() < 0.9 else "pending"
        for f, t in rng.integers(1, n_users + 1, size=(n_users * 12, 2))
    }
    reasons = ["blocked", "blocked_by", "muted", "dismissed", "reported"]
    exclusions = {
        (int(u), int(x), reasons[int(r)])
        for u, x, r in zip(rng.integers(1, n_users + 1, n_users * 3),
                           rng.integers(1, n_users + 1, n_users * 3),
                           rng.integers(0, len(reasons), n_users * 3), strict=True)
    }
    users = [
        User(i, account_status="suspended" if i % 17 == 0 else "active",
             is_discoverable=i % 13 != 0, eligible=i % 3 != 0)
        for i in ids
    ]
    fixture = Fixture(
        users=users, edges=[(f, t, s) for (f, t), s in edges.items()],
        exclusions=sorted(exclusions), missing_profiles={i for i in ids if i % 29 == 0},
    )
    settings = settings_for(tmp_path, **{
        "shard_count": 2, "hop1_cap": 30, "hop2_cap": 10, "max_candidates_to_score": 5,
        "top_k": 3, **overrides,
    })
    paths = write_run(fixture, settings)
    build_graph(paths, settings)
    return paths, settings


def plain_stage_counts(inputs, graph, settings) -> dict[str, int]:
    """The per-stage counts restated as a plain Python loop over the same inputs: count each
    expanded row (at most hop2_cap entries), flag self and exclusions (smallest code), then
    drop in predicates order, cut, take."""
    from collections import Counter

    from recs.traversal.predicates import BELOW_MIN_MUTUAL_COUNT, NOT_RECOMMENDABLE, SELF

    counts = Counter()
    indptr, indices = np.asarray(graph.indptr), np.asarray(graph.indices)
    activity = np.asarray(graph.activity)
    for user in range(len(inputs.user_ids)):
        reached = Counter()
        for friend in inputs.hop1_nodes[inputs.hop1_ptr[user]:inputs.hop1_ptr[user + 1]]:
            start = indptr[friend]
            reached.update(indices[start:min(indptr[friend + 1], start + settings.hop2_cap)])
        flags = {}
        if inputs.user_dense[user] >= 0:
            flags[int(inputs.user_dense[user])] = SELF
        for e in range(inputs.excl_ptr[user], inputs.excl_ptr[user + 1]):
            node, code = int(inputs.excl_nodes[e]), int(inputs.excl_reasons[e])
            flags[node] = min(code, flags.get(node, code))
        passing = 0
        for node, mutuals in reached.items():
            counts["candidates"] += 1
            if int(node) in flags:
                code = flags[int(node)]
            elif mutuals < settings.min_mutual_count:
                code = BELOW_MIN_MUTUAL_COUNT
            elif np.isnan(activity[node]):
                code = NOT_RECOMMENDABLE
            else:
                passing += 1
                continue
            counts[code] += 1
        scored = min(passing, settings.max_candidates_to_score)
        counts["cut_by_max_candidates_to_score"] += passing - scored
        counts["scored"] += scored
        counts["kept"] += min(scored, settings.top_k)
    return counts


def test_stage_counts_add_up_and_equal_a_plain_count(tmp_path):
    """On random_run's shard 1 (every count above 0): the kernel's counts equal
    plain_stage_counts; candidates = every drop + cut + scored; kept = output rows; chunks of
    7 users sum to the same counts."""
    from recs.traversal.graph import load_graph
    from recs.traversal.inputs import shard_inputs
    from recs.traversal.kernel import STAGE_COUNTS, recommend_users
    from recs.traversal.predicates import DROP_REASONS

    paths, settings = random_run(tmp_path)
    graph = load_graph(paths.graph_dir)
    inputs = shard_inputs(paths, settings, 1, graph)
    result = recommend_users(inputs, graph, settings)
    counts = result.stage_counts
    plain = plain_stage_counts(inputs, graph, settings)
    names = {code: f"dropped_{reason}" for code, reason in enumerate(DROP_REASONS, start=1)}
    assert counts == {name: plain.get(name, 0) for name in STAGE_COUNTS} | {
        name: plain.get(code, 0) for code, name in names.items()
    }
    assert all(counts[name] > 0 for name in STAGE_COUNTS), counts
    dropped = sum(counts[name] for name in names.values())
    assert counts["candidates"] == (
        dropped + counts["cut_by_max_candidates_to_score"] + counts["scored"]
    )
    assert counts["kept"] == len(result.rows.user)
    assert recommend_users(inputs, graph, settings, users_per_chunk=7).stage_counts == counts


def test_stage_counts_with_candidates_reached_once(tmp_path):
    """min_mutual_count 1 (shipped): candidates reached once pass, are listed apart and cut or
    scored by id (predicates.cut_to_max_candidates; max_candidates_to_score 12, so the cut
    takes some of them); the counts still equal plain_stage_counts."""
    from recs.traversal.graph import load_graph
    from recs.traversal.inputs import shard_inputs
    from recs.traversal.kernel import recommend_users

    paths, settings = random_run(tmp_path, min_mutual_count=1, max_candidates_to_score=12)
    graph = load_graph(paths.graph_dir)
    inputs = shard_inputs(paths, settings, 1, graph)
    counts = recommend_users(inputs, graph, settings).stage_counts
    plain = plain_stage_counts(inputs, graph, settings)
    assert {name: counts[name] for name in ("candidates", "cut_by_max_candidates_to_score",
                                            "scored", "kept")} == {
        name: plain[name] for name in ("candidates", "cut_by_max_candidates_to_score",
                                       "scored", "kept")
    }
    assert counts["cut_by_max_candidates_to_score"] > 0 and counts["scored"] > 0
    assert counts["dropped_below_min_mutual_count"] == 0
