{#-
    freeze_snapshot counts the in-degrees as it writes the follow edges (recs.nightly.in_degrees);
    every active follow (self-follows left out, as in stg_follow_edges) is one follower of one
    account, so the in-degrees sum to the active follows. Catches an in_degrees.parquet that is
    empty, shrunken or from another snapshot, with one count over the edges instead of a group
    by followee. Fails with both numbers.
-#}
with

active_follows as (

    select count(*) as active_follows
    from {{ ref('stg_follow_edges') }}
    where follow_status = 'active'

),

counted as (

    select coalesce(sum(in_degree), 0) as in_degrees_sum
    from {{ ref('stg_in_degrees') }}

)

select
    active_follows.active_follows,
    counted.in_degrees_sum
from active_follows
cross join counted
where active_follows.active_follows <> counted.in_degrees_sum
