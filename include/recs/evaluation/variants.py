"""The ranking variants an evaluation runs: named settings overrides of the shipped defaults.

``design`` is the design document's ranking (the default before issue 13): each mutual
path counts 1, ``min_mutual_count`` 2, uniform sampling under the caps, the 0.7 / 0.3 blend
and no top-up of short lists. Each ``design_*`` variant changes one thing of it; ``shipped``
is ``Settings()``'s defaults and each ``shipped_*`` variant takes one thing back out, so both
what each change adds on its own and what it still adds in the shipped mix are measured.
"""

from __future__ import annotations

from typing import Any

from recs.errors import EvaluationError

DESIGN: dict[str, Any] = {
    "ranking": "blend", "min_mutual_count": 2, "hop1_order": "sample", "hop2_order": "sample",
    "mutual_weight": 0.7, "activity_weight": 0.3, "popularity_weight": 0.0, "hub_damping": 0.0,
    "fill_short_lists": False,
}

VARIANTS: dict[str, tuple[str, dict[str, Any]]] = {
    "design": ("the design's blend (the default before issue 13)", DESIGN),
    "design_mutual_count_only": (
        "design, ranked by mutual count alone (no activity term, no saturation)",
        {**DESIGN, "activity_weight": 0.0, "mutual_saturation": 1e9},
    ),
    "design_min_mutual_1": ("design with min_mutual_count 1", {**DESIGN, "min_mutual_count": 1}),
    "design_adamic_adar": ("design with Adamic-Adar path weights", {**DESIGN,
                                                                    "ranking": "adamic_adar"}),
    "design_resource_allocation": (
        "design with resource-allocation path weights", {**DESIGN,
                                                         "ranking": "resource_allocation"},
    ),
    "shipped": ("the shipped default (Settings())", {}),
    "shipped_blend": ("shipped, each path counting 1", {"ranking": "blend"}),
    "shipped_resource_allocation": ("shipped, resource-allocation path weights",
                                    {"ranking": "resource_allocation"}),
    "shipped_min_mutual_2": ("shipped with min_mutual_count 2", {"min_mutual_count": 2}),
    "shipped_no_activity": ("shipped without the activity term", {"activity_weight": 0.0}),
    "shipped_no_popularity": ("shipped without the popularity term",
                              {"popularity_weight": 0.0}),
    "shipped_hub_damping": ("shipped, hub candidates damped (hub_damping 1)",
                            {"hub_damping": 1.0}),
    "shipped_hop2_sample": ("shipped, second hops sampled uniformly", {"hop2_order": "sample"}),
    "shipped_hop2_recency": ("shipped, newest second hops first", {"hop2_order": "recency"}),
    "shipped_hop2_reciprocity": ("shipped, reciprocated second hops first",
                                 {"hop2_order": "reciprocity"}),
    "shipped_hop1_recency": ("shipped, newest first hops first", {"hop1_order": "recency"}),
    "shipped_hop1_reciprocity": ("shipped, reciprocated first hops first",
                                 {"hop1_order": "reciprocity"}),
    "shipped_no_fill": ("shipped without the top-up of short lists", {"fill_short_lists": False}),
}
"""name -> (description, settings overrides of the shipped defaults)."""

DEFAULT_VARIANTS = tuple(VARIANTS)


def variant_overrides(name: str) -> dict[str, Any]:
    """The settings overrides of variant ``name``; ``EvaluationError`` naming the known ones."""
    try:
        return dict(VARIANTS[name][1])
    except KeyError:
        raise EvaluationError(
            f"unknown variant {name!r}: known variants are {', '.join(VARIANTS)}"
        ) from None
