"""recs.evaluation: recommendation quality of the product on real graphs (issue 13).

``edges`` (a dataset or a user's edge list) → ``split`` (hidden follows) → ``runner`` (the
real pipeline on the training part, the read path, the ``baselines``) → ``metrics`` →
``report``; ``variants`` names the ranking settings evaluated. ``README.md`` here has the
method; ``recs evaluate`` (``recs.cli.evaluate``) and ``make evaluate`` run it. Only the CLI
and the tests import this package.
"""
