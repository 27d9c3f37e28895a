{#-
    Every reason a user must not be recommended an account (ARCHITECTURE §1, pruning), one
    select per reason. A new exclusion is a new branch here and a new accepted reason.
-#}
with

follow_edges as (

    select * from {{ ref('stg_follow_edges') }}

),

blocks as (

    select * from {{ ref('stg_blocks') }}

),

mutes as (

    select * from {{ ref('stg_mutes') }}

),

dismissed_candidates as (

    select * from {{ ref('stg_dismissed_candidates') }}

),

following as (

    select
        follower_id as user_id,
        followee_id as excluded_id,
        'following' as reason
    from follow_edges
    where follow_status = 'active'

),

pending as (

    select
        follower_id as user_id,
        followee_id as excluded_id,
        'pending' as reason
    from follow_edges
    where follow_status = 'pending'

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

    select * from following
    union all
    select * from pending
    union all
    select * from blocked
    union all
    select * from blocked_by
    union all
    select * from muted
    union all
    select * from dismissed

)

select * from unioned
