with

users as (

    select * from {{ ref('stg_users') }}

),

in_degrees as (

    select * from {{ ref('int_user_in_degrees_counted') }}

),

profiles as (

    select
        users.user_id as candidate_id,
        users.account_status,
        users.last_active_at,
        users.is_discoverable,
        in_degrees.in_degree,
        (users.account_status = 'active' and users.is_discoverable) as is_recommendable
    from users
    inner join in_degrees
        on users.user_id = in_degrees.user_id

)

select * from profiles
order by candidate_id
