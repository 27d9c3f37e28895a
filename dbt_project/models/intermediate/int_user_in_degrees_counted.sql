-- A table, not a view like the other intermediate models: hub_accounts, candidate_profiles and
-- this model's own three tests each read it, and as a view each recomputed the distinct count
-- over every follow edge (the largest aggregation of the build at 50 M edges). Measured with
-- `python bench/scale_run.py --reuse-store` (1 M users, 50 M edges): build_models 87.7 s, peak
-- RSS 6.0 GB as a table, against 250.3 s, 8.6 GB as a view (an earlier session's run of it).
-- count(*), not count(distinct follower_id): a (follower_id, followee_id) pair is one snapshot
-- row (the store's primary key; freeze_snapshot refuses a partition that repeats a pair,
-- recs.nightly.follow_pairs), and a
-- distinct count per followee over every edge was the build's most expensive aggregate (38.7 s
-- of node time at 50 M edges).
{{ config(materialized='table') }}

with

users as (

    select * from {{ ref('stg_users') }}

),

follow_edges as (

    select * from {{ ref('stg_follow_edges') }}

),

active_followers as (

    select
        followee_id as user_id,
        count(*) as in_degree
    from follow_edges
    where follow_status = 'active'
    group by followee_id

),

in_degrees as (

    select
        users.user_id,
        coalesce(active_followers.in_degree, 0)::bigint as in_degree
    from users
    left join active_followers
        on users.user_id = active_followers.user_id

)

select * from in_degrees
