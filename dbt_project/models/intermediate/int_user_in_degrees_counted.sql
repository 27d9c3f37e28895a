-- A table, not a view like the other intermediate models: hub_accounts, candidate_profiles and
-- this model's own tests each read it. The in-degrees themselves are counted by freeze_snapshot
-- as it writes the follow edges (stg_in_degrees, recs.nightly.in_degrees): grouping every edge by
-- followee here was the build's slowest node (26.9 s of a 50.6 s build at 5 M users and 250 M
-- edges, bench/README.md); this joins a table the size of the users table instead.
{{ config(materialized='table') }}

with

users as (

    select * from {{ ref('stg_users') }}

),

counted as (

    select * from {{ ref('stg_in_degrees') }}

),

in_degrees as (

    select
        users.user_id,
        coalesce(counted.in_degree, 0)::bigint as in_degree
    from users
    left join counted
        on users.user_id = counted.user_id

)

select * from in_degrees
