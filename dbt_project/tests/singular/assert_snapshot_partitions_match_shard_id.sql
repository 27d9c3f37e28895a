{#-
    The shard function is defined once and identical in Python and SQL (ARCHITECTURE §5).
    freeze_snapshot filed every follow edge under shard_id=NNN computed in Python
    (recs.sharding); the shard_id macro must give the same shard for every follower.
    Fails with the edges where they disagree.
-#}
with

follow_edges as (

    select * from {{ ref('stg_follow_edges') }}

),

resharded as (

    select
        follower_id,
        followee_id,
        snapshot_shard_id,
        {{ shard_id('follower_id') }} as macro_shard_id
    from follow_edges

)

select * from resharded
where snapshot_shard_id <> macro_shard_id
