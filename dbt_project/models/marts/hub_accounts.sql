{#-
    Hub rule (design document, "Graph Partitioning with Hub Replication"): an account is a hub
    when its in-degree is at least the threshold. The design's 1,000,000 suits 500 M users; here
    the threshold is var hub_in_degree_threshold when set, else it scales to the graph: the
    in-degree at var hub_quantile over all accounts (discrete quantile), but never below
    var hub_min_in_degree.
-#}
{%- set fixed_threshold = var('hub_in_degree_threshold') -%}

with

in_degrees as (

    select * from {{ ref('int_user_in_degrees_counted') }}

),

threshold as (

    select
        coalesce(
            cast({{ 'null' if fixed_threshold is none else fixed_threshold }} as bigint),
            greatest(
                coalesce(quantile_disc(in_degree, {{ var('hub_quantile') }}), 0),
                {{ var('hub_min_in_degree') }}
            )
        )::bigint as hub_threshold
    from in_degrees

),

hubs as (

    select
        in_degrees.user_id,
        in_degrees.in_degree,
        threshold.hub_threshold
    from in_degrees
    cross join threshold
    where in_degrees.in_degree >= threshold.hub_threshold

)

select * from hubs
order by user_id
