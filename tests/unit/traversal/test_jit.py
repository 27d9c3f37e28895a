"""The traversal's compile cache (recs.traversal.jit): a changed stage recompiles the kernel."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import recs

#: One user follows dense 0 and 1, which both follow 2 and 3: two rows of 2 mutuals, scored by
#: ranking.ranked_score inside the cached kernel (the design's blend: 0.7, 0.3, paths of 1).
SCRIPT = """
import numpy as np
from types import SimpleNamespace
from recs.config import Settings
from recs.traversal.inputs import ShardInputs
from recs.traversal.kernel import recommend_users

inputs = ShardInputs(
    user_ids=np.array([100]), user_dense=np.array([-1], np.int32),
    hop1_ptr=np.array([0, 2]), hop1_nodes=np.array([0, 1], np.int32),
    excl_ptr=np.array([0, 0]), excl_nodes=np.zeros(0, np.int32),
    excl_reasons=np.zeros(0, np.uint8),
)
graph = SimpleNamespace(indptr=np.array([0, 2, 4, 4, 4]),
                        indices=np.array([2, 3, 2, 3], np.int32), activity=np.ones(4),
                        path_weight=np.ones(4), in_degree=np.zeros(4, np.int32),
                        recommendable=np.array([15], np.uint8))
settings = Settings(ranking="blend", mutual_weight=0.7, popularity_weight=0.0)
print(recommend_users(inputs, graph, settings).rows.score.tolist())
"""


@pytest.mark.slow
def test_changing_a_stage_module_recompiles_the_cached_kernel(tmp_path):
    """Run the kernel from a copy of recs (its cache in the copy's __pycache__), change the
    ranking module only, run again: the new formula must be used, not the cached machine code
    of the first run. Scores: 0.7 * 2/25 + 0.3 * 1 = 0.356; with the stage edited to add 1.0,
    1.356. Numba alone keys the kernel's cache on kernel.py only and would print 0.356 again."""
    package = tmp_path / "recs"
    shutil.copytree(
        Path(recs.__file__).parent, package, ignore=shutil.ignore_patterns("__pycache__")
    )
    env = {**os.environ, "PYTHONPATH": str(tmp_path), "NUMBA_CACHE_DIR": ""}
    env.pop("NUMBA_DISABLE_JIT", None)

    def scores() -> list[float]:
        done = subprocess.run(
            [sys.executable, "-c", SCRIPT],
            env=env,
            capture_output=True,
            text=True,
            check=False,
            cwd=tmp_path,
        )
        assert done.returncode == 0, done.stderr
        return [round(score, 12) for score in json.loads(done.stdout)]

    assert scores() == [0.356, 0.356]
    assert any((package / "traversal" / "__pycache__").glob("kernel._recommend-*.nbi"))
    ranking = package / "traversal" / "ranking.py"
    source = ranking.read_text()
    formula = "params.mutual_weight * mutual + params.activity_weight * activity"
    assert formula in source
    ranking.write_text(source.replace(formula, "1.0 + " + formula))
    assert scores() == [1.356, 1.356]


def test_compile_timer_counts_compiling_once_and_not_running():
    """A fresh function whose compile includes a fresh callee's: counted once (the outermost
    event), more than nothing and within the block's wall time; called again, nothing to count
    (a newcomer's demo rate had one shard's compiling in it)."""
    import time

    from numba import njit

    from recs.traversal.jit import compile_timer

    @njit
    def callee(a):
        return a * 2

    @njit
    def caller(a):
        return callee(a) + 1

    started = time.perf_counter()
    with compile_timer() as seconds:
        assert caller(20) == 41
    wall = time.perf_counter() - started
    assert 0.0 < seconds[0] <= wall
    with compile_timer() as again:
        assert caller(1) == 3
    assert again == [0.0]
