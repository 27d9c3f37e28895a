"""The shard task (recs.traversal.shard): the pipeline stage, reruns and a stale graph.

Fixtures: ``traversal_fixtures``.
"""

from __future__ import annotations

import logging

import pytest
from traversal_fixtures import build_graph, exclusion_graph, settings_for, write_run

from recs.nightly import pipeline
from recs.traversal import StaleGraphError, traverse_shard


def test_pipeline_stage_reads_frozen_settings_and_rerun_is_byte_identical(tmp_path, caplog):
    """pipeline.traverse_shard reads the settings frozen in the snapshot manifest; running
    the shard again rewrites exactly the same bytes."""
    settings = settings_for(tmp_path)
    paths = write_run(exclusion_graph(), settings)
    build_graph(paths, settings)
    with caplog.at_level(logging.INFO, logger="recs.traversal"):
        pipeline.traverse_shard(paths, 0)
    assert any("traversals" in r.getMessage() for r in caplog.records)
    first = paths.shard_output(0).read_bytes()
    traverse_shard(paths, settings, 0)
    assert paths.shard_output(0).read_bytes() == first


def test_stale_graph_is_refused(tmp_path):
    settings = settings_for(tmp_path, hop2_cap=5)
    paths = write_run(exclusion_graph(), settings)
    build_graph(paths, settings)
    with pytest.raises(StaleGraphError, match="hop2_cap=5"):
        traverse_shard(paths, settings_for(tmp_path, hop2_cap=6), 0)
    with pytest.raises(StaleGraphError):
        traverse_shard(paths, settings_for(tmp_path, hop2_cap=5, sample_seed=1), 0)
    # A graph built with a larger hop2_cap is fine: the smaller cap is a prefix of its rows,
    # so hop2_cap=3 on the hop2_cap=5 graph equals hop2_cap=3 on its own graph.
    smaller = settings_for(tmp_path, hop2_cap=3)
    assert traverse_shard(paths, smaller, 0)["traversals"] == 9  # 3 rows of 3
    reused = paths.shard_output(0).read_bytes()
    build_graph(paths, smaller)
    traverse_shard(paths, smaller, 0)
    assert paths.shard_output(0).read_bytes() == reused
