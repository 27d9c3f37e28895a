{#-
    Every reason a user must not be recommended an account (ARCHITECTURE §1, pruning), one
    select per reason, except the user's own follows (active or pending): those are the
    snapshot's follow edges, partitioned by the follower's shard, which the traversal and the
    gate read anyway; repeating them here made this the largest model of the build (one row per
    follow edge, sorted and exported). A new exclusion is a new branch here and a new accepted
    reason (recs.contracts.EXCLUSION_REASONS).
-#}
with

blocks as (

    select * from {{ ref('stg_blocks') }}

),

mutes as (

    select * from {{ ref('stg_mutes') }}

),

dismissed_candidates as (

    select * from {{ ref('stg_dismissed_candidates') }}

),


blocked as (

    select
        blocker_id as user_id,
        blocked_id as excluded_id,
        'blocked' as reason
    from blocks

),

blocked_by as (

    select
        blocked_id as user_id,
        blocker_id as excluded_id,
        'blocked_by' as reason
    from blocks

),

muted as (

    select
        muter_id as user_id,
        muted_id as excluded_id,
        'muted' as reason
    from mutes

),

dismissed as (

    select
        user_id,
        candidate_id as excluded_id,
        'dismissed' as reason
    from dismissed_candidates

),

unioned as (

    select * from blocked
    union all
    select * from blocked_by
    union all
    select * from muted
    union all
    select * from dismissed

)

select * from unioned
