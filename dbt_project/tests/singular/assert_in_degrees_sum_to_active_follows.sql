{#-
    freeze_snapshot counts the in-degrees as it writes the follow edges (recs.nightly.in_degrees);
    every active follow (self-follows left out, as in stg_follow_edges) is one follower of one
    account. So, in one pass over the edges and no group by followee, the in-degrees must sum to
    the active follows, and each account weighted by its in-degree must sum to the followees of
    those follows, by id and by DuckDB's hash of the id: an in_degrees.parquet that is empty,
    shrunken, from another snapshot or counted for the wrong accounts fails it (the hash sum
    catches counts moved between accounts whose ids sum the same). Fails with every number.
-#}
with

active_follows as (

    select
        count(*) as active_follows,
        coalesce(sum(followee_id::hugeint), 0) as followee_id_sum,
        coalesce(sum(hash(followee_id)::hugeint), 0) as followee_hash_sum
    from {{ ref('stg_follow_edges') }}
    where follow_status = 'active'

),

counted as (

    select
        coalesce(sum(in_degree), 0) as in_degrees_sum,
        coalesce(sum(user_id::hugeint * in_degree), 0) as user_id_sum,
        coalesce(sum(hash(user_id)::hugeint * in_degree), 0) as user_hash_sum
    from {{ ref('stg_in_degrees') }}

)

select
    active_follows.active_follows,
    counted.in_degrees_sum,
    active_follows.followee_id_sum,
    counted.user_id_sum,
    active_follows.followee_hash_sum,
    counted.user_hash_sum
from active_follows
cross join counted
where
    active_follows.active_follows <> counted.in_degrees_sum
    or active_follows.followee_id_sum <> counted.user_id_sum
    or active_follows.followee_hash_sum <> counted.user_hash_sum
